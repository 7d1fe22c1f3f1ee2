/**
 * The debuggee of bench/bridge_latency.py: a plain program that loops and sleeps, started with
 * -agentlib:jdwp=...,server=y,suspend=n. Its "main" thread is the one RoundTrip asks about.
 */
public final class Target {
    private Target() {}

    public static void main(String[] args) throws InterruptedException {
        long ticks = 0;
        while (ticks >= 0) {
            ticks++;
            Thread.sleep(20);
        }
        System.out.println(ticks);
    }
}
