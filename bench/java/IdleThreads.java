import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The debuggee of bench/jvm_threads.py: an idle application with 50 threads of its own (the
 * main thread and the JVM's own threads come on top), started with
 * -agentlib:jdwp=...,server=y,suspend=n. Mostly asleep or waiting, as an app between requests:
 *
 * <ul>
 *   <li>1 event loop ("event-loop"): wakes every 20 ms, hashes 4 KiB, and hands a task to the
 *       worker pool once a second;
 *   <li>10 sleepers ("sleeper-N"): Thread.sleep of 1-5 s in a loop (JDWP status SLEEPING);
 *   <li>10 timed pollers ("timer-N"): queue.poll with a 2 s timeout (timed wait);
 *   <li>10 pool workers ("worker-N"): queue.take, woken by the event loop's tasks (wait);
 *   <li>15 waiters ("waiter-N"): Object.wait() on a monitor nobody notifies (wait);
 *   <li>1 lock holder ("lock-holder"): sleeps holding a monitor, and 3 threads ("blocked-N")
 *       blocked entering it (JDWP status MONITOR).
 * </ul>
 *
 * <p>Prints "ready N" (N: threads started) once all run; then main waits forever.
 */
public final class IdleThreads {
    private IdleThreads() {}

    private static final Object NEVER = new Object();
    private static final Object LOCK = new Object();
    private static final LinkedBlockingQueue<Runnable> WORK = new LinkedBlockingQueue<>();
    private static final LinkedBlockingQueue<Object> TIMED = new LinkedBlockingQueue<>();
    private static volatile long sink;

    private static int started;

    private static void start(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
        started++;
    }

    public static void main(String[] args) throws InterruptedException {
        start("event-loop", IdleThreads::eventLoop);
        for (int i = 1; i <= 10; i++) {
            final long nap = 1000L + 400L * (i - 1);
            start("sleeper-" + i, () -> {
                try {
                    while (true) {
                        Thread.sleep(nap);
                    }
                } catch (InterruptedException e) {
                    // ends
                }
            });
        }
        for (int i = 1; i <= 10; i++) {
            start("timer-" + i, () -> {
                try {
                    while (true) {
                        TIMED.poll(2, TimeUnit.SECONDS);
                    }
                } catch (InterruptedException e) {
                    // ends
                }
            });
        }
        for (int i = 1; i <= 10; i++) {
            start("worker-" + i, () -> {
                try {
                    while (true) {
                        WORK.take().run();
                    }
                } catch (InterruptedException e) {
                    // ends
                }
            });
        }
        for (int i = 1; i <= 15; i++) {
            start("waiter-" + i, () -> {
                synchronized (NEVER) {
                    try {
                        while (true) {
                            NEVER.wait();
                        }
                    } catch (InterruptedException e) {
                        // ends
                    }
                }
            });
        }
        start("lock-holder", () -> {
            synchronized (LOCK) {
                try {
                    while (true) {
                        Thread.sleep(60_000);
                    }
                } catch (InterruptedException e) {
                    // ends
                }
            }
        });
        Thread.sleep(50); // the holder has the lock before anyone blocks on it
        for (int i = 1; i <= 3; i++) {
            start("blocked-" + i, () -> {
                synchronized (LOCK) {
                    sink++;
                }
            });
        }
        System.out.println("ready " + started);
        System.out.flush();
        synchronized (IdleThreads.class) {
            while (true) {
                IdleThreads.class.wait();
            }
        }
    }

    private static void eventLoop() {
        byte[] buffer = new byte[4096];
        long ticks = 0;
        try {
            while (true) {
                Thread.sleep(20);
                ticks++;
                long h = ticks;
                for (int i = 0; i < buffer.length; i++) {
                    buffer[i] = (byte) (h >>> 3);
                    h = h * 31 + buffer[i];
                }
                sink = h;
                if (ticks % 50 == 0) {
                    final long t = ticks;
                    WORK.put(() -> sink += t);
                }
            }
        } catch (InterruptedException e) {
            // ends
        }
    }
}
