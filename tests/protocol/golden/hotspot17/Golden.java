import java.util.concurrent.locks.LockSupport;
public class Golden {
    static final Object A = new Object(), B = new Object();
    public static void main(String[] args) throws Exception {
        Thread sleeper = new Thread(() -> { try { Thread.sleep(Long.MAX_VALUE); } catch (InterruptedException e) { } }, "worker one");
        sleeper.setDaemon(true); sleeper.start();
        Thread parked = new Thread(LockSupport::park, "odd \"quoted\" name");
        parked.setDaemon(true); parked.start();
        Thread first = new Thread(() -> lock(A, B), "deadlock-a");
        Thread second = new Thread(() -> lock(B, A), "deadlock-b");
        first.setDaemon(true); second.setDaemon(true);
        first.start(); second.start();
        System.out.println("ready"); System.out.flush();
        synchronized (Golden.class) { Golden.class.wait(); }
    }
    static void lock(Object one, Object two) {
        synchronized (one) {
            try { Thread.sleep(200); } catch (InterruptedException e) { }
            synchronized (two) { System.out.println("never"); }
        }
    }
}
