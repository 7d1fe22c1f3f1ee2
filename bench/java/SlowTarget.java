import java.util.ArrayList;
import java.util.List;

/**
 * The debuggee of bench/slow_link.py: 10 threads (main, 4 workers that wait for good, and the JVM's own 5), and
 * a loop on main that calls {@code Model.compute} every 2 ms through 18 frames of
 * {@code Layers.descend}, so a breakpoint in compute hits at once and the stack is deep. What a
 * debugger sees at the breakpoint and the 5 lines after it is the same on every run: the
 * locals and {@code this}'s fields depend on nothing that changes (the loop's counter stays in
 * main's frame, below the top 20).
 */
public final class SlowTarget {
    private SlowTarget() {}

    static volatile long sink;

    /** The object whose method the breakpoint is in: its fields never change. */
    static final class Model {
        private final String label = "slow-link";
        private final int factor = 7;
        private final double scale = 1.5;
        private final int[] table = {3, 1, 4, 1, 5, 9, 2, 6};
        private final List<String> names = new ArrayList<>(List.of("alpha", "beta"));

        long compute(int seed) {
            int a = seed * factor; // BREAKPOINT
            int b = a + table[seed % table.length];
            String tag = label + ":" + b;
            double c = b * scale;
            long d = (long) c + tag.length() + names.size();
            int e = (int) (d % 97);
            return d + e;
        }
    }

    /** Frames between the loop and compute. */
    static final class Layers {
        private Layers() {}

        static long descend(Model model, int depth, int seed) {
            if (depth == 0) {
                return model.compute(seed);
            }
            return descend(model, depth - 1, seed) + 1;
        }
    }

    public static void main(String[] args) throws InterruptedException {
        Object never = new Object();
        for (int i = 1; i <= 4; i++) {
            Thread worker = new Thread(() -> {
                synchronized (never) {
                    try {
                        never.wait();
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
            }, "worker-" + i);
            worker.setDaemon(true);
            worker.start();
        }
        Model model = new Model();
        long ticks = 0;
        while (ticks >= 0) {
            ticks++;
            sink = Layers.descend(model, 17, 3);
            Thread.sleep(2);
        }
        System.out.println(ticks);
    }
}
