import com.sun.jdi.Bootstrap;
import com.sun.jdi.ThreadReference;
import com.sun.jdi.VirtualMachine;
import com.sun.jdi.connect.AttachingConnector;
import com.sun.jdi.connect.Connector;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;

/**
 * JDI round-trip client of bench/bridge_latency.py. One long-lived process, driven over stdin so
 * every path is measured by the same warmed-up JVM:
 *
 * <pre>
 *   in:  "HOST PORT WARMUP COUNT [sync]"  attach with com.sun.jdi.SocketAttach, find the thread
 *                                   "main", call ThreadReference.status() WARMUP times untimed
 *                                   and COUNT times timed, then VirtualMachine.dispose()
 *   out: "RT ATTACH_NS T1 ... TCOUNT" (nanoseconds) or "ERR message"
 *   in:  "quit"
 * </pre>
 *
 * With "sync", the timed loop is bracketed for the caller: "MARK" is printed right before it and
 * right after it, and each time the client waits for a line ("go") on stdin before going on. The
 * bench reads every process's CPU time at the two marks, so its CPU per round trip covers the
 * timed calls only (not attach, warm-up or dispose).
 *
 * ThreadReference.status() of a thread that is not suspended is never cached by JDI (it caches
 * the status only while the thread is suspended), so each call is one JDWP command
 * (ThreadReference.Status, 11/4) and one reply. The bench checks that with ddmd's packet counters.
 */
public final class RoundTrip {
    private static BufferedReader in;

    private RoundTrip() {}

    public static void main(String[] args) throws IOException {
        in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        System.out.println("READY");
        System.out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.isEmpty()) {
                continue;
            }
            if (line.equals("quit")) {
                break;
            }
            String[] f = line.split("\\s+");
            try {
                boolean sync = f.length > 4 && f[4].equals("sync");
                System.out.println(
                        measure(f[0], f[1], Integer.parseInt(f[2]), Integer.parseInt(f[3]), sync));
            } catch (Exception e) {
                System.out.println("ERR " + e.toString().replace('\n', ' '));
            }
            System.out.flush();
        }
    }

    private static VirtualMachine attach(String host, String port) throws Exception {
        AttachingConnector connector = null;
        for (AttachingConnector c : Bootstrap.virtualMachineManager().attachingConnectors()) {
            if (c.name().equals("com.sun.jdi.SocketAttach")) {
                connector = c;
            }
        }
        if (connector == null) {
            throw new IllegalStateException("no com.sun.jdi.SocketAttach connector");
        }
        Map<String, Connector.Argument> arguments = connector.defaultArguments();
        arguments.get("hostname").setValue(host);
        arguments.get("port").setValue(port);
        arguments.get("timeout").setValue("10000");
        // A JVM listens again a few ms after its previous debugger left: retry refusals briefly.
        long deadline = System.nanoTime() + 3_000_000_000L;
        while (true) {
            try {
                return connector.attach(arguments);
            } catch (IOException e) {
                if (System.nanoTime() > deadline) {
                    throw e;
                }
                Thread.sleep(5);
            }
        }
    }

    /** Tell the bench where the timed loop starts or ends; wait until it has looked. */
    private static void mark() throws IOException {
        System.out.println("MARK");
        System.out.flush();
        String reply = in.readLine();
        if (reply == null || !reply.trim().equals("go")) {
            throw new IOException("expected \"go\" after MARK, got " + reply);
        }
    }

    private static String measure(String host, String port, int warmup, int count, boolean sync)
            throws Exception {
        long t0 = System.nanoTime();
        VirtualMachine vm = attach(host, port);
        long attachNs = System.nanoTime() - t0;
        try {
            ThreadReference main = null;
            for (ThreadReference t : vm.allThreads()) {
                if (t.name().equals("main")) {
                    main = t;
                }
            }
            if (main == null) {
                throw new IllegalStateException("the target has no thread named main");
            }
            long sink = 0;
            for (int i = 0; i < warmup; i++) {
                sink += main.status();
            }
            long[] samples = new long[count];
            if (sync) {
                mark();
            }
            for (int i = 0; i < count; i++) {
                long start = System.nanoTime();
                sink += main.status();
                samples[i] = System.nanoTime() - start;
            }
            if (sync) {
                mark();
            }
            StringBuilder out = new StringBuilder(count * 7 + 32);
            out.append("RT ").append(attachNs);
            for (long s : samples) {
                out.append(' ').append(s);
            }
            if (sink == Long.MIN_VALUE) {
                out.append(" !");
            }
            return out.toString();
        } finally {
            vm.dispose();
        }
    }
}
