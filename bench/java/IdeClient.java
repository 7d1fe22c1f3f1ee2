import com.sun.jdi.AbsentInformationException;
import com.sun.jdi.ArrayReference;
import com.sun.jdi.Bootstrap;
import com.sun.jdi.ClassType;
import com.sun.jdi.Field;
import com.sun.jdi.LocalVariable;
import com.sun.jdi.Location;
import com.sun.jdi.ObjectReference;
import com.sun.jdi.ReferenceType;
import com.sun.jdi.StackFrame;
import com.sun.jdi.StringReference;
import com.sun.jdi.ThreadReference;
import com.sun.jdi.Value;
import com.sun.jdi.VirtualMachine;
import com.sun.jdi.connect.AttachingConnector;
import com.sun.jdi.connect.Connector;
import com.sun.jdi.event.BreakpointEvent;
import com.sun.jdi.event.Event;
import com.sun.jdi.event.EventSet;
import com.sun.jdi.event.LocatableEvent;
import com.sun.jdi.event.StepEvent;
import com.sun.jdi.request.BreakpointRequest;
import com.sun.jdi.request.EventRequest;
import com.sun.jdi.request.EventRequestManager;
import com.sun.jdi.request.StepRequest;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * An IDE-like JDI client for bench/slow_link.py: one debugging session as IntelliJ or Android
 * Studio runs it, timed phase by phase.
 *
 * <p>Usage: {@code java IdeClient HOST PORT CLASS LINE STEPS VIEWFILE}. Attach (SocketAttach),
 * ask the VM's name, version and capabilities; set a breakpoint (suspend all) at CLASS:LINE and
 * wait for it; at the stop and after each of STEPS steps (step over) do what an IDE does to
 * show a stop: every thread's status and name, the event thread's top 20 frames with their
 * locations, frame 0's visible locals and {@code this} with values (a string's value, an
 * array's length, an object's type), and the first time a frame's class is met its source name,
 * methods, superclass and interfaces. Then dispose.
 *
 * <p>Prints {@code PHASE NAME START_US END_US} (wall clock, microseconds since the epoch) for
 * attach, bp (breakpoint set until its event arrives), stop (the breakpoint stop shown),
 * step1..stepN (step request to stop shown) and detach, then {@code SESSION START_US END_US};
 * writes what it saw (threads sorted by name, frames, locations, values, no ids) to VIEWFILE.
 * Every wait is bounded (attach 20 s, events 30 s); an error prints {@code ERR ...}, exit 2.
 *
 * <p>With a seventh argument {@code hold} (tests/e2e/test_foresight_jvm.py): it prints
 * {@code ARMED} once the breakpoint is set, and at the breakpoint stop it prints
 * {@code HOLD breakpoint} and reads one line from stdin before asking anything,
 * so that something else may happen to the VM meanwhile (another debugger resumes it); each
 * thread's line then also says whether the VM calls it suspended.
 */
public final class IdeClient {
    private static final int TOP_FRAMES = 20;
    private static final long EVENT_TIMEOUT_MS = 30_000;

    private final VirtualMachine vm;
    private final StringBuilder view = new StringBuilder();
    private final Set<ReferenceType> seen = new HashSet<>();
    private final boolean hold;

    private IdeClient(VirtualMachine vm, boolean hold) {
        this.vm = vm;
        this.hold = hold;
    }

    static long nowUs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1000;
    }

    static void phase(String name, long start) {
        System.out.println("PHASE " + name + " " + start + " " + nowUs());
    }

    static VirtualMachine attach(String host, String port) throws Exception {
        AttachingConnector socket = Bootstrap.virtualMachineManager().attachingConnectors()
            .stream().filter(c -> "com.sun.jdi.SocketAttach".equals(c.name())).findFirst()
            .orElseThrow(() -> new IllegalStateException("no SocketAttach connector"));
        Map<String, Connector.Argument> settings = socket.defaultArguments();
        String[][] values = {{"hostname", host}, {"port", port}, {"timeout", "20000"}};
        for (String[] kv : values) {
            settings.get(kv[0]).setValue(kv[1]);
        }
        return socket.attach(settings);
    }

    /** The next event of one of these kinds; others are let go. */
    private LocatableEvent next(Class<? extends LocatableEvent> kind) throws Exception {
        long deadline = System.currentTimeMillis() + EVENT_TIMEOUT_MS;
        while (true) {
            long left = deadline - System.currentTimeMillis();
            EventSet set = left > 0 ? vm.eventQueue().remove(left) : null;
            if (set == null) {
                throw new IllegalStateException("no " + kind.getSimpleName() + " within 30 s");
            }
            for (Event event : set) {
                if (kind.isInstance(event)) {
                    return kind.cast(event);
                }
            }
            set.resume();
        }
    }

    private String show(Value value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof StringReference) {
            return "\"" + ((StringReference) value).value() + "\"";
        }
        if (value instanceof ArrayReference) {
            return value.type().name() + " length " + ((ArrayReference) value).length();
        }
        if (value instanceof ObjectReference) {
            return "{" + ((ObjectReference) value).referenceType().name() + "}";
        }
        return value.toString();
    }

    private void classMet(ReferenceType type) {
        if (!seen.add(type)) {
            return;
        }
        String source;
        try {
            source = type.sourceName();
        } catch (AbsentInformationException e) {
            source = "?";
        }
        int methods = type.methods().size();
        String superName = "-";
        int interfaces = 0;
        if (type instanceof ClassType) {
            ClassType superclass = ((ClassType) type).superclass();
            superName = superclass == null ? "-" : superclass.name();
            interfaces = ((ClassType) type).interfaces().size();
        }
        view.append("  class ").append(type.name()).append(" source=").append(source)
            .append(" methods=").append(methods).append(" super=").append(superName)
            .append(" interfaces=").append(interfaces).append('\n');
    }

    /** What an IDE asks to show a stop of ``thread``. */
    private void inspect(String label, ThreadReference thread) throws Exception {
        view.append("stop ").append(label).append('\n');
        List<String> threads = new ArrayList<>();
        for (ThreadReference t : vm.allThreads()) {
            int status = t.status();
            String suspended = hold ? " suspended=" + t.isSuspended() : "";
            threads.add(t.name() + " status=" + status + suspended);
        }
        Collections.sort(threads);
        for (String t : threads) {
            view.append("  thread ").append(t).append('\n');
        }
        int count = thread.frameCount();
        List<StackFrame> frames = thread.frames(0, Math.min(TOP_FRAMES, count));
        view.append("  frames ").append(count).append('\n');
        for (StackFrame frame : frames) {
            Location loc = frame.location();
            ReferenceType type = loc.declaringType();
            classMet(type);
            view.append("  at ").append(type.name()).append('.').append(loc.method().name())
                .append(':').append(loc.lineNumber()).append('\n');
        }
        StackFrame top = frames.get(0);
        List<LocalVariable> locals;
        try {
            locals = top.visibleVariables();
        } catch (AbsentInformationException e) {
            locals = List.of();
        }
        Map<LocalVariable, Value> values = top.getValues(locals);
        for (LocalVariable local : locals) {
            view.append("  local ").append(local.name()).append(" = ")
                .append(show(values.get(local))).append('\n');
        }
        ObjectReference self = top.thisObject();
        if (self != null) {
            List<Field> fields = self.referenceType().visibleFields();
            Map<Field, Value> fieldValues = self.getValues(fields);
            for (Field f : fields) {
                view.append("  this.").append(f.name()).append(" = ")
                    .append(show(fieldValues.get(f))).append('\n');
            }
        }
    }

    private void session(long start, String className, int line, int steps) throws Exception {
        long t = start;
        vm.name();
        vm.version();
        vm.canGetSourceDebugExtension();
        phase("attach", t);

        t = nowUs();
        List<ReferenceType> classes = vm.classesByName(className);
        if (classes.isEmpty()) {
            throw new IllegalStateException(className + " is not loaded");
        }
        List<Location> at = classes.get(0).locationsOfLine(line);
        if (at.isEmpty()) {
            throw new IllegalStateException("no code at " + className + ":" + line);
        }
        EventRequestManager requests = vm.eventRequestManager();
        BreakpointRequest bp = requests.createBreakpointRequest(at.get(0));
        bp.setSuspendPolicy(EventRequest.SUSPEND_ALL);
        bp.enable();
        if (hold) {
            System.out.println("ARMED");
            System.out.flush();
        }
        LocatableEvent hit = next(BreakpointEvent.class);
        phase("bp", t);
        t = nowUs();
        ThreadReference thread = hit.thread();
        if (hold) {
            System.out.println("HOLD breakpoint");
            System.out.flush();
            String answer = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            if (answer == null) {
                throw new IllegalStateException("stdin ended during the hold");
            }
        }
        inspect("breakpoint", thread);
        phase("stop", t);

        for (int i = 1; i <= steps; i++) {
            t = nowUs();
            StepRequest step = requests.createStepRequest(
                thread, StepRequest.STEP_LINE, StepRequest.STEP_OVER);
            step.addCountFilter(1);
            step.setSuspendPolicy(EventRequest.SUSPEND_ALL);
            step.enable();
            vm.resume();
            next(StepEvent.class);
            requests.deleteEventRequest(step);
            inspect("step " + i, thread);
            phase("step" + i, t);
        }

        t = nowUs();
        vm.dispose();
        phase("detach", t);
    }

    public static void main(String[] args) throws IOException {
        boolean hold = args.length == 7 && "hold".equals(args[6]);
        if (args.length != 6 && !hold) {
            System.err.println("usage: IdeClient HOST PORT CLASS LINE STEPS VIEWFILE [hold]");
            System.exit(1);
        }
        long start = nowUs();
        IdeClient client = null;
        try {
            client = new IdeClient(attach(args[0], args[1]), hold);
            client.session(start, args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]));
        } catch (Exception e) {
            System.out.println("ERR " + e);
            System.out.flush();
            System.exit(2);
        }
        System.out.println("SESSION " + start + " " + nowUs());
        try (PrintWriter out = new PrintWriter(
                Files.newBufferedWriter(Paths.get(args[5]), StandardCharsets.UTF_8))) {
            out.print(client.view);
        }
        System.out.flush();
    }
}
