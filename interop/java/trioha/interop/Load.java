package trioha.interop;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The load generator of {@code trio-ha bench versus-rocketmq}: the same program, with the same
 * settings, against a real RocketMQ cluster and against ours.
 *
 * <pre>
 * send --namesrv A --topic T --threads N --count C [--size 1024] [--batch 1] [--warmup W]
 *      [--max-seconds S]
 * pull --namesrv A --topic T --group G --expect C [--max-seconds S]
 * </pre>
 *
 * <p>{@code send}: W warm-up sends first (the JIT and the connections settle), then N threads
 * send C messages in all (a send is one message, or a batch of {@code --batch}), each send
 * timed. {@code pull}: a lite pull consumer (32 per pull) reads C messages; the clock starts at
 * the first message. Each prints one JSON line: count, seconds, latency percentiles (sends),
 * statuses, errors.
 */
public final class Load {
    private Load() {
    }

    public static void main(String[] argv) {
        Json.runToExit(argv, (command, opts) -> {
            if (command.equals("send")) {
                send(opts);
            } else if (command.equals("pull")) {
                pull(opts);
            } else {
                throw new IllegalArgumentException("unknown subcommand " + command);
            }
        });
    }

    static void send(Client.Options opts) throws Exception {
        String topic = opts.require("topic");
        int threads = opts.getInt("threads", 1);
        int count = opts.getInt("count", 1000);
        int batch = opts.getInt("batch", 1);
        int warmup = opts.getInt("warmup", 200);
        long deadline = System.nanoTime() + 1_000_000_000L * opts.getInt("max-seconds", 120);
        byte[] body = new byte[opts.getInt("size", 1024)];
        Arrays.fill(body, (byte) 'x');

        DefaultMQProducer producer = new DefaultMQProducer("bench_producer");
        producer.setNamesrvAddr(opts.require("namesrv"));
        producer.setSendMsgTimeout(10_000);
        producer.setRetryTimesWhenSendFailed(0);
        producer.setInstanceName("load-" + ProcessHandle.current().pid());
        producer.start();
        try {
            for (int i = 0; i < warmup; i++) {
                try {
                    producer.send(new Message(topic, "warm", body));
                } catch (Exception e) {
                    // The topic's route may still be on its way; the timed phase counts errors.
                }
            }
            Json.print(Json.obj("phase", "start"));
            long cpuStart = processCpuNanos();
            int sends = (count + batch - 1) / batch;
            AtomicInteger next = new AtomicInteger();
            AtomicInteger errors = new AtomicInteger();
            AtomicLong sent = new AtomicLong();
            Map<String, Integer> statuses = new TreeMap<>();
            long[][] latencies = new long[threads][];
            List<Thread> workers = new ArrayList<>();
            long start = System.nanoTime();
            for (int t = 0; t < threads; t++) {
                final int me = t;
                Thread worker = new Thread(() -> {
                    long[] mine = new long[sends];
                    int n = 0;
                    while (next.getAndIncrement() < sends && System.nanoTime() < deadline) {
                        long began = System.nanoTime();
                        try {
                            SendResult result;
                            if (batch == 1) {
                                result = producer.send(new Message(topic, "bench", body));
                            } else {
                                List<Message> msgs = new ArrayList<>(batch);
                                for (int i = 0; i < batch; i++) {
                                    msgs.add(new Message(topic, "bench", body));
                                }
                                result = producer.send(msgs);
                            }
                            mine[n++] = System.nanoTime() - began;
                            sent.addAndGet(batch);
                            synchronized (statuses) {
                                statuses.merge(result.getSendStatus().name(), 1, Integer::sum);
                            }
                        } catch (Exception e) {
                            errors.incrementAndGet();
                        }
                    }
                    latencies[me] = Arrays.copyOf(mine, n);
                });
                workers.add(worker);
                worker.start();
            }
            for (Thread worker : workers) {
                worker.join();
            }
            double seconds = (System.nanoTime() - start) / 1e9;
            double cpu = (processCpuNanos() - cpuStart) / 1e9;
            long[] all = Arrays.stream(latencies).flatMapToLong(Arrays::stream).sorted().toArray();
            Json.print(Json.obj("phase", "send", "threads", threads, "batch", batch,
                "messages", sent.get(), "seconds", seconds, "p50_us", percentile(all, 0.5),
                "p99_us", percentile(all, 0.99), "errors", errors.get(), "statuses", statuses,
                "cpu_seconds", cpu));
        } finally {
            producer.shutdown();
        }
    }

    /** This JVM's CPU time so far (all threads), in nanoseconds. */
    static long processCpuNanos() {
        java.lang.management.OperatingSystemMXBean os =
            java.lang.management.ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean) {
            return ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime();
        }
        return 0;
    }

    static double percentile(long[] sorted, double q) {
        if (sorted.length == 0) {
            return -1;
        }
        int index = (int) Math.min(sorted.length - 1, Math.floor(q * sorted.length));
        return sorted[index] / 1000.0;
    }

    static void pull(Client.Options opts) throws Exception {
        int expect = opts.getInt("expect", 1000);
        long deadline = System.nanoTime() + 1_000_000_000L * opts.getInt("max-seconds", 120);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(opts.require("group"));
        consumer.setNamesrvAddr(opts.require("namesrv"));
        consumer.setInstanceName("load-" + ProcessHandle.current().pid());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPullBatchSize(32);
        consumer.subscribe(opts.require("topic"), "*");
        consumer.start();
        long received = 0;
        long bytes = 0;
        long start = 0;
        long cpuStart = 0;
        try {
            while (received < expect && System.nanoTime() < deadline) {
                List<MessageExt> msgs = consumer.poll(1000);
                if (!msgs.isEmpty() && start == 0) {
                    start = System.nanoTime();
                    cpuStart = processCpuNanos();
                    Json.print(Json.obj("phase", "start"));
                }
                for (MessageExt msg : msgs) {
                    bytes += msg.getBody().length;
                }
                received += msgs.size();
            }
        } finally {
            double seconds = start == 0 ? 0 : (System.nanoTime() - start) / 1e9;
            double cpu = start == 0 ? 0 : (processCpuNanos() - cpuStart) / 1e9;
            Json.print(Json.obj("phase", "pull", "messages", received, "seconds", seconds,
                "bytes", bytes, "cpu_seconds", cpu));
            consumer.shutdown();
        }
    }
}
