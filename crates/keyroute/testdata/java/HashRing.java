// The consistent-hashing note's Java sketch, verbatim (../shared/seeds/004_*.txt, "A small Java sketch").
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.*;

public class HashRing {
    private final TreeMap<Long, String> ring = new TreeMap<>();
    private final int virtualNodes;

    public HashRing(int virtualNodes) {
        this.virtualNodes = virtualNodes;
    }

    public void addNode(String node) {
        for (int i = 0; i < virtualNodes; i++) ring.put(hash(node + "#" + i), node);
    }

    public void removeNode(String node) {
        for (int i = 0; i < virtualNodes; i++) ring.remove(hash(node + "#" + i));
    }

    // The first node clockwise from the key's position.
    public String nodeFor(String key) {
        Map.Entry<Long, String> e = ring.ceilingEntry(hash(key));
        return (e != null ? e : ring.firstEntry()).getValue();
    }

    // The owner plus the next distinct nodes clockwise, for replication.
    public List<String> nodesFor(String key, int count) {
        Set<String> found = new LinkedHashSet<>();
        for (String node : ring.tailMap(hash(key)).values()) {
            if (found.size() == count) break;
            found.add(node);
        }
        for (String node : ring.values()) {
            if (found.size() == count) break;
            found.add(node);
        }
        return new ArrayList<>(found);
    }

    private static long hash(String s) {
        try {
            byte[] d = MessageDigest.getInstance("MD5").digest(s.getBytes(StandardCharsets.UTF_8));
            long h = 0;
            for (int i = 0; i < 8; i++) h = (h << 8) | (d[i] & 0xff);
            return h;
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
