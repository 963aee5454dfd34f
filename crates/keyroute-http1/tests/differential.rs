//! The differential test of the request parser against hyper's HTTP/1 server (issue 20): one
//! byte stream to each; keyroute must find the same messages (method, target, header fields and
//! body: the same boundaries, and after a refused upgrade too) and make the same accept or refuse decision, or refuse where hyper accepts
//! (stricter). A fixed corpus of RFC 9112 corner cases, then seeded mutations of it (bounded:
//! `KEYROUTE_DIFF_CASES`, 3,000 by default). Longer runs: the fuzz target
//! `fuzz/src/targets/http1_differential.rs`.

#[path = "support/compare.rs"]
mod compare;

use keyroute_http1::Limits;

/// Requests that exercise every framing rule, alone and pipelined.
const CORPUS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /a?b=c HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /n HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
    b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    b"POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    b"GET / HTTP/1.1\nHost: a\n\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
    b"GET http://a.example/x?y HTTP/1.1\r\nHost: b\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\nGET /ignored HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n",
    b"PUT /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
    b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
    b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    b"GET /\x80 HTTP/1.1\r\nHost: a\r\n\r\n",
    b"G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX-\xff: v\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 00005\r\n\r\nhello",
    b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nshort",
    // Refused upgrades: what follows is HTTP/1 again, where a smuggled request would hide.
    b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /u HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /u HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\nPOST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok",
    // Headers compared too: duplicates, empty values, whitespace around values.
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\nX-Empty:\r\nX-Pad:   v  \r\n\r\n",
];

/// Bytes that move parsers' decisions.
const SPICE: &[&[u8]] = &[
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"\t",
    b":",
    b",",
    b";",
    b"0",
    b"5",
    b"f",
    b"chunked",
    b"Content-Length: 4\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"\r\n\r\n",
    b"\x00",
    b"\x7f",
    b"\xff",
    b"HTTP/1.0",
    b"Connection: close\r\n",
];

/// A seeded generator (a counter through keyroute's `mix64`): the same cases on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        keyroute::hash::mix64(self.0)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(out.len() + 1);
        match rng.below(5) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = SPICE[rng.below(SPICE.len())][0];
            }
            1 if !out.is_empty() => {
                let end = (at + 1 + rng.below(4)).min(out.len());
                out.drain(at.min(end)..end);
            }
            2 => {
                let s = SPICE[rng.below(SPICE.len())];
                out.splice(at..at, s.iter().copied());
            }
            3 => {
                // Another request glued on: pipelining.
                let other = CORPUS[rng.below(CORPUS.len())];
                out.extend_from_slice(other);
            }
            _ => {
                let b = (rng.next() & 0xff) as u8;
                out.insert(at, b);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parser_frames_as_hyper_does_or_refuses_more() {
    let limits = Limits::default();
    let cases: usize = std::env::var("KEYROUTE_DIFF_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let mut rng = Rng(0x6b65_7972_6f75_7465);
    let mut inputs: Vec<Vec<u8>> = CORPUS.iter().map(|c| c.to_vec()).collect();
    for _ in 0..cases {
        let base = CORPUS[rng.below(CORPUS.len())];
        inputs.push(mutate(&mut rng, base));
    }
    let (mut agreed, mut stricter) = (0, 0);
    let mut failures = Vec::new();
    for input in &inputs {
        let ours = compare::engine(input, &limits);
        let theirs = compare::hyper_server(input).await;
        match compare::disagreement(&ours, &theirs) {
            Some(why) => failures.push(format!("{:?}: {why}", String::from_utf8_lossy(input))),
            None if ours.0.len() < theirs.len() => stricter += 1,
            None => agreed += 1,
        }
    }
    eprintln!("{} inputs: {agreed} framed alike, {stricter} refused by keyroute only", inputs.len());
    assert!(failures.is_empty(), "{} disagreements:\n{}", failures.len(), failures.join("\n"));
    // The comparison has teeth: the corpus has inputs hyper accepts and keyroute refuses.
    assert!(stricter > 0 && agreed > 0);
}

/// The corpus alone, with what each side decides: the cases the README of the engine names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc_9112_corner_cases_against_hyper() {
    let limits = Limits::default();
    let expect: &[(&[u8], usize, compare::End)] = &[
        // Pipelining: both messages.
        (CORPUS[1], 2, compare::End::Complete),
        (CORPUS[2], 2, compare::End::Complete),
        // Chunked with extensions and trailers, then another request.
        (CORPUS[4], 2, compare::End::Complete),
        // CL and TE together: refused (hyper takes the chunked body).
        (CORPUS[5], 0, compare::End::Refused(400)),
        // A list of lengths, a signed length: refused.
        (CORPUS[7], 0, compare::End::Refused(400)),
        (CORPUS[8], 0, compare::End::Refused(400)),
        // gzip, chunked: 501.
        (CORPUS[9], 0, compare::End::Refused(501)),
        // obs-fold, space before the colon, bare LF, bare CR: refused.
        (CORPUS[12], 0, compare::End::Refused(400)),
        (CORPUS[13], 0, compare::End::Refused(400)),
        (CORPUS[14], 0, compare::End::Refused(400)),
        (CORPUS[15], 0, compare::End::Refused(400)),
        // HTTP/1.0 closes after one request; with keep-alive it goes on.
        (CORPUS[18], 1, compare::End::Complete),
        (CORPUS[19], 2, compare::End::Complete),
        // Expect: 100-continue with its body.
        (CORPUS[20], 1, compare::End::Complete),
        // Connection: close ends the connection's requests.
        (CORPUS[22], 1, compare::End::Complete),
        // A bare LF in chunked framing.
        (CORPUS[23], 0, compare::End::Refused(400)),
        // HTTP/2.0 in an HTTP/1 request line.
        (CORPUS[25], 0, compare::End::Refused(505)),
        // A short body: incomplete.
        (CORPUS[31], 0, compare::End::Incomplete),
        // After a refused upgrade, the next request is framed by both (and its headers alike).
        (CORPUS[32], 2, compare::End::Complete),
        (CORPUS[33], 2, compare::End::Complete),
        (CORPUS[34], 2, compare::End::Complete),
        (CORPUS[35], 2, compare::End::Complete),
        (CORPUS[36], 1, compare::End::Complete),
    ];
    for (input, n, end) in expect {
        let ours = compare::engine(input, &limits);
        assert_eq!((ours.0.len(), ours.1), (*n, *end), "{:?}", String::from_utf8_lossy(input));
        let theirs = compare::hyper_server(input).await;
        assert_eq!(compare::disagreement(&ours, &theirs), None, "{:?}", String::from_utf8_lossy(input));
        // Where both accept, hyper framed what keyroute did: the comparison saw every message.
        if matches!(end, compare::End::Complete) {
            assert_eq!(theirs.len(), *n, "{:?}", String::from_utf8_lossy(input));
        }
    }
    // The header comparison has teeth: one field differing is a disagreement.
    let ours = compare::engine(CORPUS[36], &limits);
    let mut theirs = compare::hyper_server(CORPUS[36]).await;
    assert!(theirs[0].headers.iter().any(|(n, v)| n == "x-pad" && v == b"v"), "{:?}", theirs[0].headers);
    theirs[0].headers.retain(|(n, _)| n != "x-empty");
    assert!(compare::disagreement(&ours, &theirs).is_some());
}
