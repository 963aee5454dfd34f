// Runs the note's experiment with its sketch: 10,000 keys user:0..user:9999 on A, B, C with 100
// virtual nodes, then adding D. Prints the per-node counts, the keys moved and where they went,
// and each of the first 20 keys' 3-node preference list on A, B, C, D.
import java.util.*;

public class Figures {
    public static void main(String[] args) {
        HashRing ring = new HashRing(100);
        for (String n : List.of("A", "B", "C")) ring.addNode(n);
        String[] before = new String[10000];
        Map<String, Integer> counts = new TreeMap<>();
        for (int i = 0; i < 10000; i++) {
            before[i] = ring.nodeFor("user:" + i);
            counts.merge(before[i], 1, Integer::sum);
        }
        System.out.println("counts " + counts);
        ring.addNode("D");
        int moved = 0;
        Map<String, Integer> to = new TreeMap<>();
        for (int i = 0; i < 10000; i++) {
            String after = ring.nodeFor("user:" + i);
            if (!after.equals(before[i])) {
                moved++;
                to.merge(after, 1, Integer::sum);
            }
        }
        System.out.println("moved " + moved + " to " + to);
        for (int i = 0; i < 20; i++) System.out.println("user:" + i + " " + ring.nodesFor("user:" + i, 3));
    }
}
