import com.android.ddmlib.AndroidDebugBridge;
import com.android.ddmlib.Client;
import com.android.ddmlib.ClientData;
import com.android.ddmlib.DdmPreferences;
import com.android.ddmlib.IDevice;
import com.android.ddmlib.ThreadInfo;

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * Drives the classic ddmlib (Debian's libandroid-ddms-java, ddmlib 25.2.2) as DDMS does, and
 * reports what it learns as one JSON object per line on stdout.
 *
 * <pre>
 * java -DANDROID_ADB_SERVER_PORT=N -cp ddmlib.jar:common.jar:guava.jar:kxml2.jar:DIR DdmlibProbe
 *      [--base 8600] [--selected 8700] [--adb PATH] [--devices 1] [--clients 1]
 *      [--ddm-clients 1] [--want name,threads,heap] [--timeout 60] [--log info] [--stay]
 * </pre>
 *
 * <p>ddmlib reads the adb server's port from the system property (or the environment variable)
 * ANDROID_ADB_SERVER_PORT. The probe calls DdmPreferences.setDebugPortBase(--base) and
 * setSelectedDebugPort(--selected) (ddmlib's per-client debugger ports and its "selected
 * client" port, which ddmd's own ports may clash with), then AndroidDebugBridge.init(true)
 * (client support: ddmlib opens jdwp:PID to every debuggable VM and speaks DDM to it) and
 * createBridge: with --adb PATH, createBridge(PATH, false), which runs "PATH version" and
 * "PATH -P N start-server" first and "PATH -P N kill-server" at the end; without it,
 * createBridge(), which starts and kills nothing.
 *
 * <p>For every client that has a name (its HELO or APNM arrived) it asks for threads
 * (setThreadUpdateEnabled(true), requestThreadUpdate) and heap information
 * (setHeapUpdateEnabled(true), executeGarbageCollector), repeating the request every 2 s until
 * the data came. Events, in the order they happen:
 *
 * <pre>
 * {"event":"device","serial":S,"state":"ONLINE"}                  on every state change
 * {"event":"client","serial":S,"pid":P,"name":N|null,"ddm":B,"debugPort":D,"vm":V|null}
 *                                                                 first seen, and on a change
 * {"event":"threads","serial":S,"pid":P,"threads":[names...]}      whenever the list changes
 * {"event":"heap","serial":S,"pid":P,"heaps":{"ID":{"maxSizeInBytes":..,"sizeInBytes":..,
 *      "bytesAllocated":..,"objectsAllocated":..}}}                whenever heap info arrives
 * {"event":"client_gone","serial":S,"pid":P}
 * {"event":"done"}      when --devices devices are online, --clients clients are listed and
 *                       --ddm-clients named clients delivered everything in --want
 * {"event":"timeout","missing":TEXT}   when that did not happen within --timeout seconds
 * {"event":"bye"}       after disconnectBridge() and terminate()
 * </pre>
 *
 * <p>Without --stay the probe stops after "done" (exit 0) or "timeout" (exit 2). With --stay
 * it keeps ddmlib connected, still reporting, until stdin closes; lines on stdin are commands:
 * "gc" (executeGarbageCollector on every client), "threads" (requestThreadUpdate on every
 * client), "list" (report every device and client again). ddmlib's own log goes to stderr.
 */
public final class DdmlibProbe {
    private static PrintStream out;
    private static final Object LOCK = new Object();

    // Options
    private static int base = 8600;
    private static int selected = 8700;
    private static String adb = null;
    private static int wantDevices = 1;
    private static int wantClients = 1;
    private static int wantDdmClients = 1;
    private static Set<String> want = new HashSet<>(List.of("name", "threads", "heap"));
    private static long timeoutMs = 60_000;
    private static String logLevel = "info";
    private static boolean stay = false;

    // What was reported (guarded by LOCK)
    private static final Map<String, String> deviceStates = new HashMap<>();
    private static final Map<String, String> clientLines = new HashMap<>();
    private static final Map<String, String> threadLines = new HashMap<>();
    private static final Set<String> withThreads = new HashSet<>();
    private static final Set<String> withHeap = new HashSet<>();
    private static final Map<String, Long> lastAsked = new HashMap<>();

    private static volatile boolean stdinClosed = false;

    private DdmlibProbe() {}

    public static void main(String[] args) throws Exception {
        out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        System.setOut(System.err); // whatever ddmlib prints goes to stderr
        parse(args);

        DdmPreferences.setLogLevel(logLevel);
        DdmPreferences.setDebugPortBase(base);
        DdmPreferences.setSelectedDebugPort(selected);
        AndroidDebugBridge.init(true);
        AndroidDebugBridge.addDeviceChangeListener(new AndroidDebugBridge.IDeviceChangeListener() {
            @Override
            public void deviceConnected(IDevice device) {
                reportDevice(device);
            }

            @Override
            public void deviceDisconnected(IDevice device) {
                synchronized (LOCK) {
                    deviceStates.remove(device.getSerialNumber());
                    emit("{\"event\":\"device\",\"serial\":" + q(device.getSerialNumber())
                            + ",\"state\":\"DISCONNECTED\"}");
                }
            }

            @Override
            public void deviceChanged(IDevice device, int changeMask) {
                reportDevice(device);
            }
        });
        AndroidDebugBridge.addClientChangeListener((client, changeMask) -> {
            if ((changeMask & Client.CHANGE_THREAD_DATA) != 0) {
                reportThreads(client);
            }
            if ((changeMask & Client.CHANGE_HEAP_DATA) != 0) {
                reportHeap(client);
            }
            if ((changeMask & (Client.CHANGE_NAME | Client.CHANGE_DEBUGGER_STATUS
                    | Client.CHANGE_PORT | Client.CHANGE_INFO)) != 0) {
                reportClient(client);
            }
        });

        AndroidDebugBridge bridge = adb == null
                ? AndroidDebugBridge.createBridge()
                : AndroidDebugBridge.createBridge(adb, false);
        if (bridge == null) {
            emit("{\"event\":\"error\",\"message\":\"createBridge returned null\"}");
            AndroidDebugBridge.terminate();
            System.exit(3);
        }
        if (stay) {
            Thread reader = new Thread(DdmlibProbe::readCommands, "probe-stdin");
            reader.setDaemon(true);
            reader.start();
        }

        long deadline = System.currentTimeMillis() + timeoutMs;
        boolean done = false;
        boolean timedOut = false;
        int status = 0;
        while (true) {
            poll(bridge);
            String missing = missing(bridge);
            if (!done && missing == null) {
                done = true;
                emit("{\"event\":\"done\"}");
            }
            if (!done && !timedOut && System.currentTimeMillis() > deadline) {
                timedOut = true;
                emit("{\"event\":\"timeout\",\"missing\":" + q(missing) + "}");
                if (!stay) {
                    status = 2;
                }
            }
            if (stay ? stdinClosed : (done || timedOut)) {
                break;
            }
            Thread.sleep(100);
        }
        AndroidDebugBridge.disconnectBridge();
        AndroidDebugBridge.terminate();
        emit("{\"event\":\"bye\"}");
        out.flush();
        System.exit(status);
    }

    private static void parse(String[] args) {
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            switch (a) {
                case "--stay":
                    stay = true;
                    break;
                case "--base":
                    base = Integer.parseInt(args[++i]);
                    break;
                case "--selected":
                    selected = Integer.parseInt(args[++i]);
                    break;
                case "--adb":
                    adb = args[++i];
                    break;
                case "--devices":
                    wantDevices = Integer.parseInt(args[++i]);
                    break;
                case "--clients":
                    wantClients = Integer.parseInt(args[++i]);
                    break;
                case "--ddm-clients":
                    wantDdmClients = Integer.parseInt(args[++i]);
                    break;
                case "--want":
                    want = new HashSet<>();
                    for (String w : args[++i].split(",")) {
                        if (!w.isEmpty()) {
                            want.add(w);
                        }
                    }
                    break;
                case "--timeout":
                    timeoutMs = (long) (Double.parseDouble(args[++i]) * 1000);
                    break;
                case "--log":
                    logLevel = args[++i];
                    break;
                default:
                    System.err.println("DdmlibProbe: unknown argument " + a);
                    System.exit(64);
            }
        }
    }

    // ------------------------------------------------------------------------------ reporting

    private static void emit(String line) {
        synchronized (LOCK) {
            out.println(line);
            out.flush();
        }
    }

    private static String key(Client client) {
        return client.getDevice().getSerialNumber() + "/" + client.getClientData().getPid();
    }

    private static void reportDevice(IDevice device) {
        String state = String.valueOf(device.getState());
        synchronized (LOCK) {
            if (state.equals(deviceStates.get(device.getSerialNumber()))) {
                return;
            }
            deviceStates.put(device.getSerialNumber(), state);
            emit("{\"event\":\"device\",\"serial\":" + q(device.getSerialNumber())
                    + ",\"state\":" + q(state) + "}");
        }
    }

    private static void reportClient(Client client) {
        ClientData data = client.getClientData();
        String line = "{\"event\":\"client\",\"serial\":" + q(client.getDevice().getSerialNumber())
                + ",\"pid\":" + data.getPid()
                + ",\"name\":" + q(data.getClientDescription())
                + ",\"ddm\":" + data.isDdmAware()
                + ",\"debugPort\":" + client.getDebuggerListenPort()
                + ",\"vm\":" + q(data.getVmIdentifier()) + "}";
        synchronized (LOCK) {
            if (line.equals(clientLines.put(key(client), line))) {
                return;
            }
            emit(line);
        }
    }

    private static void reportThreads(Client client) {
        ThreadInfo[] threads = client.getClientData().getThreads();
        if (threads.length == 0) {
            return;
        }
        StringBuilder names = new StringBuilder("[");
        for (int i = 0; i < threads.length; i++) {
            if (i > 0) {
                names.append(',');
            }
            names.append(q(threads[i].getThreadName()));
        }
        names.append(']');
        String line = "{\"event\":\"threads\",\"serial\":" + q(client.getDevice().getSerialNumber())
                + ",\"pid\":" + client.getClientData().getPid() + ",\"threads\":" + names + "}";
        synchronized (LOCK) {
            withThreads.add(key(client));
            if (line.equals(threadLines.put(key(client), line))) {
                return;
            }
            emit(line);
        }
    }

    private static void reportHeap(Client client) {
        ClientData data = client.getClientData();
        Map<Integer, ClientData.HeapInfo> heaps = new TreeMap<>();
        synchronized (data) {
            Iterator<Integer> ids = data.getVmHeapIds();
            while (ids.hasNext()) {
                Integer id = ids.next();
                heaps.put(id, data.getVmHeapInfo(id));
            }
        }
        if (heaps.isEmpty()) {
            return;
        }
        StringBuilder json = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<Integer, ClientData.HeapInfo> e : heaps.entrySet()) {
            ClientData.HeapInfo h = e.getValue();
            if (!first) {
                json.append(',');
            }
            first = false;
            json.append(q(String.valueOf(e.getKey()))).append(":{\"maxSizeInBytes\":")
                    .append(h.maxSizeInBytes).append(",\"sizeInBytes\":").append(h.sizeInBytes)
                    .append(",\"bytesAllocated\":").append(h.bytesAllocated)
                    .append(",\"objectsAllocated\":").append(h.objectsAllocated)
                    .append(",\"reason\":").append(h.reason).append('}');
        }
        json.append('}');
        synchronized (LOCK) {
            withHeap.add(key(client));
            emit("{\"event\":\"heap\",\"serial\":" + q(client.getDevice().getSerialNumber())
                    + ",\"pid\":" + data.getPid() + ",\"heaps\":" + json + "}");
        }
    }

    // ------------------------------------------------------------------------------ polling

    /** Reports devices and clients seen (listeners can miss the first ones) and asks named
     *  clients for threads and heap information until they arrive. */
    private static void poll(AndroidDebugBridge bridge) {
        Set<String> present = new HashSet<>();
        for (IDevice device : bridge.getDevices()) {
            reportDevice(device);
            for (Client client : device.getClients()) {
                present.add(key(client));
                reportClient(client);
                if (client.getClientData().getClientDescription() != null) {
                    ask(client);
                }
            }
        }
        synchronized (LOCK) {
            for (String k : new ArrayList<>(clientLines.keySet())) {
                if (!present.contains(k)) {
                    clientLines.remove(k);
                    threadLines.remove(k);
                    int slash = k.lastIndexOf('/');
                    emit("{\"event\":\"client_gone\",\"serial\":" + q(k.substring(0, slash))
                            + ",\"pid\":" + k.substring(slash + 1) + "}");
                }
            }
        }
    }

    private static void ask(Client client) {
        String k = key(client);
        long now = System.currentTimeMillis();
        boolean needThreads;
        boolean needHeap;
        synchronized (LOCK) {
            needThreads = want.contains("threads") && !withThreads.contains(k);
            needHeap = want.contains("heap") && !withHeap.contains(k);
            Long last = lastAsked.get(k);
            if ((!needThreads && !needHeap) || (last != null && now - last < 2000)) {
                return;
            }
            lastAsked.put(k, now);
        }
        if (needThreads) {
            client.setThreadUpdateEnabled(true);
            client.requestThreadUpdate();
        }
        if (needHeap) {
            client.setHeapUpdateEnabled(true);
            client.executeGarbageCollector();
        }
    }

    /** What is still missing for "done", or null. */
    private static String missing(AndroidDebugBridge bridge) {
        int online = 0;
        int clients = 0;
        int complete = 0;
        for (IDevice device : bridge.getDevices()) {
            if (!device.isOnline()) {
                continue;
            }
            online++;
            for (Client client : device.getClients()) {
                clients++;
                String k = key(client);
                boolean named = client.getClientData().getClientDescription() != null;
                synchronized (LOCK) {
                    if (named
                            && (!want.contains("threads") || withThreads.contains(k))
                            && (!want.contains("heap") || withHeap.contains(k))) {
                        complete++;
                    }
                }
            }
        }
        if (online < wantDevices) {
            return online + " of " + wantDevices + " devices online";
        }
        if (clients < wantClients) {
            return clients + " of " + wantClients + " clients listed";
        }
        if (complete < wantDdmClients) {
            return complete + " of " + wantDdmClients + " named clients have " + want;
        }
        return null;
    }

    private static void readCommands() {
        try (BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                String command = line.trim();
                AndroidDebugBridge bridge = AndroidDebugBridge.getBridge();
                if (bridge == null || command.isEmpty()) {
                    continue;
                }
                for (IDevice device : bridge.getDevices()) {
                    for (Client client : device.getClients()) {
                        switch (command) {
                            case "gc":
                                client.executeGarbageCollector();
                                break;
                            case "threads":
                                client.requestThreadUpdate();
                                break;
                            case "list":
                                synchronized (LOCK) {
                                    clientLines.remove(key(client));
                                    threadLines.remove(key(client));
                                }
                                reportClient(client);
                                reportThreads(client);
                                break;
                            default:
                                System.err.println("DdmlibProbe: unknown command " + command);
                        }
                    }
                }
            }
        } catch (Exception e) {
            System.err.println("DdmlibProbe: stdin: " + e);
        }
        stdinClosed = true;
    }

    // ------------------------------------------------------------------------------ JSON

    private static String q(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    b.append("\\\"");
                    break;
                case '\\':
                    b.append("\\\\");
                    break;
                case '\n':
                    b.append("\\n");
                    break;
                case '\r':
                    b.append("\\r");
                    break;
                case '\t':
                    b.append("\\t");
                    break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }
}
