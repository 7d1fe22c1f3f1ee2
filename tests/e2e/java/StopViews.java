import com.sun.jdi.AbsentInformationException;
import com.sun.jdi.Bootstrap;
import com.sun.jdi.ClassType;
import com.sun.jdi.LocalVariable;
import com.sun.jdi.Location;
import com.sun.jdi.ReferenceType;
import com.sun.jdi.StackFrame;
import com.sun.jdi.ThreadReference;
import com.sun.jdi.Value;
import com.sun.jdi.VirtualMachine;
import com.sun.jdi.connect.AttachingConnector;
import com.sun.jdi.connect.Connector;
import com.sun.jdi.event.BreakpointEvent;
import com.sun.jdi.event.ClassPrepareEvent;
import com.sun.jdi.event.Event;
import com.sun.jdi.event.EventSet;
import com.sun.jdi.event.StepEvent;
import com.sun.jdi.request.ClassPrepareRequest;
import com.sun.jdi.request.EventRequest;
import com.sun.jdi.request.StepRequest;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * An IDE-shaped JDI client for tests/e2e/test_foresight_jvm.py: at each stop (a breakpoint, then a
 * step over), what an IDE shows: the threads, the event thread's top frames (class, method, line,
 * source, superclass, interfaces), the top frame's visible variables, and {@code this}.
 *
 * <pre>
 *   java StopViews HOST PORT CLASS LINE STOPS
 * </pre>
 *
 * The VM is started with suspend=y. Prints the views; exits 0.
 */
public class StopViews {
    public static void main(String[] args) throws Exception {
        AttachingConnector connector = Bootstrap.virtualMachineManager().attachingConnectors()
            .stream().filter(c -> "com.sun.jdi.SocketAttach".equals(c.name())).findFirst().get();
        Map<String, Connector.Argument> arguments = connector.defaultArguments();
        arguments.get("hostname").setValue(args[0]);
        arguments.get("port").setValue(args[1]);
        VirtualMachine vm = connector.attach(arguments);
        String className = args[2];
        int line = Integer.parseInt(args[3]);
        int stops = Integer.parseInt(args[4]);
        ClassPrepareRequest prepare = vm.eventRequestManager().createClassPrepareRequest();
        prepare.addClassFilter(className);
        prepare.enable();  // the VM_START event's set resumes the VM below
        int seen = 0;
        while (seen < stops) {
            EventSet set = vm.eventQueue().remove();
            for (Event event : set) {
                if (event instanceof ClassPrepareEvent) {
                    ReferenceType type = ((ClassPrepareEvent) event).referenceType();
                    Location at = type.locationsOfLine(line).get(0);
                    EventRequest bp = vm.eventRequestManager().createBreakpointRequest(at);
                    bp.setSuspendPolicy(EventRequest.SUSPEND_ALL);
                    bp.enable();
                } else if (event instanceof BreakpointEvent) {
                    ThreadReference thread = ((BreakpointEvent) event).thread();
                    inspect("breakpoint", thread);
                    StepRequest step = vm.eventRequestManager().createStepRequest(
                        thread, StepRequest.STEP_LINE, StepRequest.STEP_OVER);
                    step.addCountFilter(1);
                    step.setSuspendPolicy(EventRequest.SUSPEND_ALL);
                    step.enable();
                } else if (event instanceof StepEvent) {
                    inspect("step", ((StepEvent) event).thread());
                    vm.eventRequestManager().deleteEventRequest(event.request());
                    seen++;
                }
            }
            set.resume();
        }
        vm.dispose();
    }

    static void inspect(String label, ThreadReference thread) throws Exception {
        StringBuilder view = new StringBuilder("stop " + label + "\n");
        List<String> threads = new ArrayList<>();
        for (ThreadReference t : thread.virtualMachine().allThreads()) {
            int status = t.status();
            threads.add(t.name() + (t.equals(thread) ? " status=" + status : ""));
        }
        Collections.sort(threads);
        for (String t : threads) {
            view.append("  thread ").append(t).append('\n');
        }
        int count = thread.frameCount();
        List<StackFrame> frames = thread.frames(0, Math.min(20, count));
        view.append("  frames ").append(count).append('\n');
        for (StackFrame frame : frames) {
            Location loc = frame.location();
            ReferenceType type = loc.declaringType();
            String superName = "-";
            int interfaces = 0;
            if (type instanceof ClassType) {
                ClassType superclass = ((ClassType) type).superclass();
                superName = superclass == null ? "-" : superclass.name();
                interfaces = ((ClassType) type).interfaces().size();
            }
            view.append("  at ").append(type.name()).append('.').append(loc.method().name())
                .append(':').append(loc.lineNumber()).append(" source=").append(type.sourceName())
                .append(" super=").append(superName).append(" interfaces=").append(interfaces)
                .append('\n');
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
                .append(values.get(local)).append('\n');
        }
        view.append("  this ").append(top.thisObject() == null ? "null" : "object").append('\n');
        System.out.print(view);
        System.out.flush();
    }
}
