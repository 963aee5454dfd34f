// Prints Guava's consistentHash for keys (hex, one per line, in argv[0]) hashed with murmur3_128
// and md5, and for raw long inputs (argv[1], one per line), for each bucket count of BUCKETS.
// Output lines: "murmur3 HEX N BUCKET", "md5 HEX N BUCKET", "long INPUT N BUCKET".
import com.google.common.hash.Hashing;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HexFormat;
import java.util.List;

public class Golden {
    static final int[] BUCKETS = {1, 2, 3, 7, 8, 31, 100, 1000, 65536};

    public static void main(String[] args) throws Exception {
        StringBuilder out = new StringBuilder();
        List<String> keys = Files.readAllLines(Paths.get(args[0]));
        for (String hex : keys) {
            byte[] k = HexFormat.of().parseHex(hex);
            for (int n : BUCKETS) {
                out.append("murmur3 ").append(hex.isEmpty() ? "-" : hex).append(' ').append(n).append(' ')
                   .append(Hashing.consistentHash(Hashing.murmur3_128().hashBytes(k), n)).append('\n');
                out.append("md5 ").append(hex.isEmpty() ? "-" : hex).append(' ').append(n).append(' ')
                   .append(Hashing.consistentHash(Hashing.md5().hashBytes(k), n)).append('\n');
            }
        }
        for (String line : Files.readAllLines(Paths.get(args[1]))) {
            long input = Long.parseLong(line);
            for (int n : BUCKETS) {
                out.append("long ").append(input).append(' ').append(n).append(' ')
                   .append(Hashing.consistentHash(input, n)).append('\n');
            }
        }
        System.out.print(out);
    }
}
