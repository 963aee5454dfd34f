-- wrk script for bench/gateway.sh: every request is GET /?k=N with N uniform in 1..100000.
-- The seed is left at LuaJIT's default, so every proxy sees the same key sequence.
request = function()
  return wrk.format(nil, "/?k=" .. math.random(1, 100000))
end
