import java.io.*;
import java.util.*;
import java.util.concurrent.*;

// Launches child processes from several threads at once, as a build tool or
// a test runner does; prints what they printed, in a fixed order.
public class ProcessLaunch {
    static String run(String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        return p.waitFor() + ":" + out.trim();
    }

    public static void main(String[] args) throws Exception {
        int tasks = Integer.parseInt(args[0]);
        ExecutorService pool = Executors.newFixedThreadPool(4);
        List<Future<String>> results = new ArrayList<>();
        for (int i = 0; i < tasks; i++) {
            final int n = i;
            results.add(pool.submit(() -> {
                // Garbage on the native heap too (strings, zip, regex) while others launch.
                StringBuilder sb = new StringBuilder();
                for (int k = 0; k < 200; k++) sb.append(Integer.toHexString(n * k));
                return run("/bin/sh", "-c", "echo task " + n + " $((" + n + " * 7))") + " "
                    + sb.length();
            }));
        }
        for (Future<String> f : results) System.out.println(f.get());
        pool.shutdown();
        System.out.println(run("/bin/echo", "done"));
    }
}
