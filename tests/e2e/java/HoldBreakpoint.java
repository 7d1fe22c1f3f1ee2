import com.sun.jdi.Bootstrap;
import com.sun.jdi.IntegerValue;
import com.sun.jdi.LocalVariable;
import com.sun.jdi.Location;
import com.sun.jdi.ReferenceType;
import com.sun.jdi.StackFrame;
import com.sun.jdi.ThreadReference;
import com.sun.jdi.VirtualMachine;
import com.sun.jdi.connect.AttachingConnector;
import com.sun.jdi.connect.Connector;
import com.sun.jdi.event.BreakpointEvent;
import com.sun.jdi.event.Event;
import com.sun.jdi.event.EventSet;
import com.sun.jdi.request.BreakpointRequest;
import com.sun.jdi.request.EventRequest;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A JDI debugger for tests/e2e/test_multi_debugger.py: it holds one thread stopped at a
 * breakpoint while another debugger works on the same VM.
 *
 * <pre>
 *   java HoldBreakpoint HOST PORT CLASS LINE VARIABLE HOLD_MS
 * </pre>
 *
 * Attaches with com.sun.jdi.SocketAttach, sets a SUSPEND_EVENT_THREAD breakpoint at CLASS:LINE
 * and prints "SET". When it hits, prints "HIT VARIABLE=VALUE count=C" (C: the thread's suspend
 * count as this debugger sees it), then holds the thread: it waits for the line "release" on
 * stdin and for HOLD_MS since the hit, whichever comes later. Then it prints "HOLD_END
 * count=C suspended=BOOL", deletes the breakpoint, resumes the event set and prints "RESUMED".
 * On the line "quit" it disposes of the connection and prints "BYE". Any failure prints "ERR
 * ..." and exits with status 1. Every wait is bounded (30 s).
 */
public final class HoldBreakpoint {
    private static final long CAP_MS = 30_000;

    private HoldBreakpoint() {}

    public static void main(String[] args) {
        try {
            run(args[0], args[1], args[2], Integer.parseInt(args[3]), args[4],
                    Long.parseLong(args[5]));
        } catch (Exception e) {
            System.out.println("ERR " + e.toString().replace('\n', ' '));
            System.out.flush();
            System.exit(1);
        }
    }

    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static VirtualMachine attach(String host, String port) throws Exception {
        for (AttachingConnector c : Bootstrap.virtualMachineManager().attachingConnectors()) {
            if (c.name().equals("com.sun.jdi.SocketAttach")) {
                Map<String, Connector.Argument> arguments = c.defaultArguments();
                arguments.get("hostname").setValue(host);
                arguments.get("port").setValue(port);
                arguments.get("timeout").setValue("10000");
                return c.attach(arguments);
            }
        }
        throw new IllegalStateException("no com.sun.jdi.SocketAttach connector");
    }

    /** The next line of stdin, read on a daemon thread so that the wait is bounded. */
    private static String readLine(BufferedReader in, long timeoutMs) throws Exception {
        final String[] line = new String[1];
        Thread reader = new Thread(() -> {
            try {
                line[0] = in.readLine();
            } catch (Exception e) {
                line[0] = null;
            }
        });
        reader.setDaemon(true);
        reader.start();
        reader.join(timeoutMs);
        if (reader.isAlive()) {
            throw new IllegalStateException("no line on stdin within " + timeoutMs + " ms");
        }
        return line[0] == null ? "" : line[0].trim();
    }

    private static void run(String host, String port, String className, int line,
            String variable, long holdMs) throws Exception {
        BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
        VirtualMachine vm = attach(host, port);
        List<ReferenceType> types = vm.classesByName(className);
        if (types.isEmpty()) {
            throw new IllegalStateException(className + " is not loaded");
        }
        List<Location> locations = types.get(0).locationsOfLine(line);
        if (locations.isEmpty()) {
            throw new IllegalStateException("no code at " + className + ":" + line);
        }
        BreakpointRequest request =
                vm.eventRequestManager().createBreakpointRequest(locations.get(0));
        request.setSuspendPolicy(EventRequest.SUSPEND_EVENT_THREAD);
        request.enable();
        say("SET");

        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CAP_MS);
        EventSet events = null;
        ThreadReference thread = null;
        while (thread == null) {
            long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (left <= 0) {
                throw new IllegalStateException("the breakpoint did not hit within " + CAP_MS
                        + " ms");
            }
            events = vm.eventQueue().remove(left);
            if (events == null) {
                continue;
            }
            for (Event event : events) {
                if (event instanceof BreakpointEvent && event.request() == request) {
                    thread = ((BreakpointEvent) event).thread();
                }
            }
            if (thread == null) {
                events.resume();
            }
        }
        long hit = System.nanoTime();
        StackFrame frame = thread.frame(0);
        LocalVariable local = frame.visibleVariableByName(variable);
        if (local == null) {
            throw new IllegalStateException("no local " + variable + " (compile with -g)");
        }
        int value = ((IntegerValue) frame.getValue(local)).value();
        say("HIT " + variable + "=" + value + " count=" + thread.suspendCount());

        String got = readLine(in, CAP_MS);
        if (!got.equals("release")) {
            throw new IllegalStateException("expected \"release\", got \"" + got + "\"");
        }
        long held = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - hit);
        if (held < holdMs) {
            Thread.sleep(holdMs - held);
        }
        say("HOLD_END count=" + thread.suspendCount() + " suspended=" + thread.isSuspended());
        vm.eventRequestManager().deleteEventRequest(request);
        events.resume();
        say("RESUMED count=" + thread.suspendCount());

        got = readLine(in, CAP_MS);
        if (!got.equals("quit")) {
            throw new IllegalStateException("expected \"quit\", got \"" + got + "\"");
        }
        vm.dispose();
        say("BYE");
    }
}
