import com.android.ddmlib.AndroidDebugBridge;
import com.android.ddmlib.Client;
import com.android.ddmlib.DdmPreferences;
import com.android.ddmlib.IDevice;
import com.android.ddmlib.Log;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

/**
 * The ddmlib reference of bench/bridge_latency.py: the old Android Studio / DDMS library
 * (Debian's libandroid-ddms-java, ddmlib 25.x) monitoring the VMs of an adb server, so that a JDI
 * client can go through ddmlib's per-VM debugger port the way it goes through ddmd's.
 *
 * <pre>
 *   java -cp CLASSES:DDMLIB_JARS DdmlibDriver ADB_PORT DEBUG_PORT_BASE SELECTED_PORT
 *        [TIMEOUT_S [LOG_LEVEL]]         (defaults: 30 s, "warn"; "debug" and "verbose" say more)
 *   out: "CLIENT SERIAL PID DEBUGGER_PORT"   once per VM whose debugger port is open
 *        "READY"                             after the first such VM
 *        "ERR message"                       when no VM shows up within TIMEOUT_S (default 30)
 *   in:  "quit" (or end of input)            stop the bridge and exit
 * </pre>
 *
 * ADB_PORT is handed to ddmlib as the ANDROID_ADB_SERVER_PORT system property (this ddmlib reads
 * the property first, then the environment variable). createBridge() without an adb location
 * only connects to a running server: ddmlib never starts or restarts one. DEBUG_PORT_BASE is the
 * first per-VM debugger port (ddmlib's default is 8600) and SELECTED_PORT the "selected client"
 * port (default 8700), so the bench never collides with a ddmd or DDMS running on the machine.
 * ddmlib's own log lines go to stderr.
 */
public final class DdmlibDriver {
    private DdmlibDriver() {}

    @SuppressWarnings("deprecation") // Log.setLogOutput: this ddmlib's way to route its log
    public static void main(String[] args) throws IOException, InterruptedException {
        if (args.length < 3) {
            System.out.println("ERR usage: DdmlibDriver ADB_PORT DEBUG_PORT_BASE SELECTED_PORT");
            return;
        }
        System.setProperty("ANDROID_ADB_SERVER_PORT", args[0]);
        DdmPreferences.setDebugPortBase(Integer.parseInt(args[1]));
        DdmPreferences.setSelectedDebugPort(Integer.parseInt(args[2]));
        DdmPreferences.setInitialThreadUpdate(false);
        DdmPreferences.setInitialHeapUpdate(false);
        DdmPreferences.setLogLevel(args.length > 4 ? args[4] : "warn");
        long timeoutNs = (args.length > 3 ? Long.parseLong(args[3]) : 30) * 1_000_000_000L;
        Log.setLogOutput(
                new Log.ILogOutput() {
                    @Override
                    public void printLog(Log.LogLevel level, String tag, String message) {
                        System.err.println("ddmlib " + level + " " + tag + ": " + message);
                    }

                    @Override
                    public void printAndPromptLog(Log.LogLevel level, String tag, String message) {
                        printLog(level, tag, message);
                    }
                });

        AndroidDebugBridge.init(true);
        AndroidDebugBridge bridge = AndroidDebugBridge.createBridge();
        long deadline = System.nanoTime() + timeoutNs;
        boolean found = false;
        while (!found) {
            for (IDevice device : bridge.getDevices()) {
                for (Client client : device.getClients()) {
                    int port = client.getDebuggerListenPort();
                    if (port > 0) {
                        System.out.println(
                                "CLIENT " + device.getSerialNumber() + " "
                                        + client.getClientData().getPid() + " " + port);
                        found = true;
                    }
                }
            }
            if (!found) {
                if (System.nanoTime() > deadline) {
                    System.out.println(
                            "ERR no VM with a debugger port within "
                                    + timeoutNs / 1_000_000_000L + " s (connected to adb: "
                                    + bridge.isConnected() + ", devices: "
                                    + bridge.getDevices().length + ")");
                    System.out.flush();
                    AndroidDebugBridge.terminate();
                    System.exit(1);
                }
                Thread.sleep(20);
            }
        }
        System.out.println("READY");
        System.out.flush();
        BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null && !line.trim().equals("quit")) {
            // keep serving debuggers until told to stop
        }
        AndroidDebugBridge.terminate();
        System.exit(0);
    }
}
