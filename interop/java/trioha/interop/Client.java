package trioha.interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * The real RocketMQ Java client, driven from our interop tests.
 *
 * <p>Each subcommand prints one JSON object per line on stdout, so a test reads what the client
 * saw without parsing logs: a line per message sent or received, then a {@code "done"} line.
 * Errors the client reports for one message are printed on that message's line (class, message
 * and, for a broker refusal, the response code) rather than ending the program: the tests
 * assert exact refusals.
 *
 * <pre>
 * produce --namesrv A --topic T --count N [--mode sync|async|oneway|batch|transaction] [--batch 32]
 *         [--tx-plan CRU] [--tx-check C|R] [--linger-seconds S]
 *         [--tags TagA,TagB] [--size BYTES] [--prefix TEXT] [--group G] [--timeout MS]
 *         [--retries N] [--delay LEVEL] [--property k=v]... [--access-key AK --secret-key SK]
 *         [--poll-namesrv-ms MS]
 * produce --mode steady --namesrv A --topic T --stop-file F [--max-seconds S] [--count N]
 *         [--interval-ms MS] ...
 * push    --namesrv A --topic T[,T2...] --group G [--tags 'TagA || TagB'] [--expect N]
 *         [--max-seconds S] [--idle-seconds S] [--later-first | --always-later | --orderly]
 *         [--max-reconsume N] [--expect-later N --linger-seconds S]
 * pull    --namesrv A --topic T[,T2...] --group G [--tags EXPR] [--expect N] [--max-seconds S]
 *         [--idle-seconds S] [--access-key AK --secret-key SK]
 * </pre>
 *
 * <p>{@code --access-key}/{@code --secret-key} sign every request with RocketMQ's ACL hook
 * ({@code AclClientRPCHook}), as an application of a broker with {@code aclEnable=true} does.
 *
 * <p>{@code --later-first} makes the push listener answer RECONSUME_LATER the first time it sees
 * each message, which sends it back to the broker (CONSUMER_SEND_MSG_BACK). {@code --orderly}
 * consumes with a MessageListenerOrderly, which locks each queue at the broker (LOCK_BATCH_MQ)
 * before it reads it.
 *
 * <p>{@code --mode steady} sends one message after another, going on after a failed send (as an
 * application riding out a failover does), until the file {@code --stop-file} exists, after
 * {@code --max-seconds} (120) or {@code --count} (1000000) sends, {@code --interval-ms} (0)
 * apart; each line has its wall-clock time {@code t} in milliseconds. {@code --poll-namesrv-ms} is the client's
 * pollNameServerInterval: how soon it learns a route change (a new master) by itself.
 */
public final class Client {
    private Client() {
    }

    public static void main(String[] argv) {
        Json.runToExit(argv, (command, opts) -> {
            switch (command) {
                case "produce":
                    produce(opts);
                    break;
                case "push":
                    push(opts);
                    break;
                case "pull":
                    pull(opts);
                    break;
                default:
                    throw new IllegalArgumentException("unknown subcommand " + command);
            }
        });
    }

    /**
     * The ACL hook for {@code --access-key}/{@code --secret-key}, or null. Made by reflection:
     * the hook is in rocketmq-acl, which RocketMQ 5's client classpath does not have, and this
     * program compiles against both.
     */
    static RPCHook aclHook(Options opts) throws Exception {
        if (!opts.has("access-key")) {
            return null;
        }
        Class<?> credentials = Class.forName("org.apache.rocketmq.acl.common.SessionCredentials");
        Object session = credentials.getConstructor(String.class, String.class)
            .newInstance(opts.require("access-key"), opts.require("secret-key"));
        return (RPCHook) Class.forName("org.apache.rocketmq.acl.common.AclClientRPCHook")
            .getConstructor(credentials).newInstance(session);
    }

    // --- produce ---------------------------------------------------------------------------

    static Message message(Options opts, int i) {
        String[] tags = opts.get("tags", "TagA").split(",");
        StringBuilder body = new StringBuilder(opts.get("prefix", "body")).append('-').append(i);
        int size = opts.getInt("size", 0);
        while (body.length() < size) {
            body.append('x');
        }
        Message msg = new Message(opts.require("topic"), tags[i % tags.length], "key-" + i,
            body.toString().getBytes(StandardCharsets.UTF_8));
        msg.putUserProperty("seq", Integer.toString(i));
        for (String kv : opts.all("property")) {
            int eq = kv.indexOf('=');
            msg.putUserProperty(kv.substring(0, eq), kv.substring(eq + 1));
        }
        int delay = opts.getInt("delay", 0);
        if (delay > 0) {
            msg.setDelayTimeLevel(delay);
        }
        return msg;
    }

    static LocalTransactionState state(char c) {
        switch (c) {
            case 'C':
                return LocalTransactionState.COMMIT_MESSAGE;
            case 'R':
                return LocalTransactionState.ROLLBACK_MESSAGE;
            default:
                return LocalTransactionState.UNKNOW;
        }
    }

    static void produce(Options opts) throws Exception {
        DefaultMQProducer producer =
            new DefaultMQProducer(opts.get("group", "interop_producer"), aclHook(opts));
        producer.setNamesrvAddr(opts.require("namesrv"));
        producer.setSendMsgTimeout(opts.getInt("timeout", 5000));
        producer.setRetryTimesWhenSendFailed(opts.getInt("retries", 0));
        producer.setRetryTimesWhenSendAsyncFailed(opts.getInt("retries", 0));
        producer.setInstanceName("producer-" + ProcessHandle.current().pid());
        producer.setPollNameServerInterval(opts.getInt("poll-namesrv-ms", 30000));
        producer.start();
        String mode = opts.get("mode", "sync");
        int count = opts.getInt("count", mode.equals("steady") ? 1000000 : 1);
        AtomicInteger errors = new AtomicInteger();
        try {
            if (mode.equals("steady")) {
                java.io.File stopFile = new java.io.File(opts.require("stop-file"));
                long deadline = System.currentTimeMillis() + 1000L * opts.getInt("max-seconds", 120);
                for (int i = 0; i < count && !stopFile.exists() && System.currentTimeMillis() < deadline; i++) {
                    Map<String, Object> line;
                    try {
                        line = sent(i, producer.send(message(opts, i)));
                    } catch (Exception e) {
                        errors.incrementAndGet();
                        line = failed(i, e);
                        Thread.sleep(20);
                    }
                    line.put("t", System.currentTimeMillis());
                    Json.print(line);
                    Thread.sleep(opts.getInt("interval-ms", 0));
                }
            } else if (mode.equals("batch")) {
                int batch = opts.getInt("batch", 32);
                for (int start = 0; start < count; start += batch) {
                    List<Message> msgs = new ArrayList<>();
                    for (int i = start; i < Math.min(count, start + batch); i++) {
                        msgs.add(message(opts, i));
                    }
                    try {
                        SendResult result = producer.send(msgs);
                        String[] ids = result.getMsgId().split(",");
                        String[] offsetIds = result.getOffsetMsgId() == null
                            ? new String[0] : result.getOffsetMsgId().split(",");
                        for (int j = 0; j < msgs.size(); j++) {
                            Map<String, Object> line = sent(start + j, result);
                            line.put("msgId", j < ids.length ? ids[j] : null);
                            line.put("offsetMsgId", j < offsetIds.length ? offsetIds[j] : null);
                            line.put("queueOffset", result.getQueueOffset() + j);
                            Json.print(line);
                        }
                    } catch (Exception e) {
                        for (int j = 0; j < msgs.size(); j++) {
                            errors.incrementAndGet();
                            Json.print(failed(start + j, e));
                        }
                    }
                }
            } else if (mode.equals("transaction")) {
                producer.shutdown();
                TransactionMQProducer tx = new TransactionMQProducer(opts.get("group", "interop_tx_producer"));
                tx.setNamesrvAddr(opts.require("namesrv"));
                tx.setSendMsgTimeout(opts.getInt("timeout", 5000));
                tx.setRetryTimesWhenSendFailed(opts.getInt("retries", 0));
                tx.setInstanceName("tx-" + ProcessHandle.current().pid());
                // --tx-plan: each message's local transaction in turn, C(ommit) R(ollback)
                // U(nknown); --tx-check: what a check-back answers (C or R).
                String plan = opts.get("tx-plan", "C");
                LocalTransactionState checkAnswer = state(opts.get("tx-check", "C").charAt(0));
                tx.setTransactionListener(new TransactionListener() {
                    @Override
                    public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                        return state(plan.charAt((Integer) arg % plan.length()));
                    }

                    @Override
                    public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                        Json.print(Json.obj("checked", msg.getTransactionId(), "topic", msg.getTopic(),
                            "checkTimes", msg.getProperty("TRANSACTION_CHECK_TIMES")));
                        return checkAnswer;
                    }
                });
                tx.start();
                producer = tx;
                for (int i = 0; i < count; i++) {
                    try {
                        TransactionSendResult result = tx.sendMessageInTransaction(message(opts, i), i);
                        Map<String, Object> line = sent(i, result);
                        line.put("localTransactionState", String.valueOf(result.getLocalTransactionState()));
                        Json.print(line);
                    } catch (Exception e) {
                        errors.incrementAndGet();
                        Json.print(failed(i, e));
                    }
                }
                // --linger-seconds: stay up to answer the broker's check-backs.
                Thread.sleep(opts.getInt("linger-seconds", 0) * 1000L);
            } else if (mode.equals("async")) {
                CountDownLatch latch = new CountDownLatch(count);
                for (int i = 0; i < count; i++) {
                    final int seq = i;
                    producer.send(message(opts, i), new SendCallback() {
                        @Override
                        public void onSuccess(SendResult result) {
                            Json.print(sent(seq, result));
                            latch.countDown();
                        }

                        @Override
                        public void onException(Throwable e) {
                            errors.incrementAndGet();
                            Json.print(failed(seq, e));
                            latch.countDown();
                        }
                    });
                }
                if (!latch.await(opts.getInt("max-seconds", 60), TimeUnit.SECONDS)) {
                    errors.addAndGet((int) latch.getCount());
                    Json.print(Json.obj("error", "async sends not answered", "missing", latch.getCount()));
                }
            } else {
                for (int i = 0; i < count; i++) {
                    try {
                        if (mode.equals("oneway")) {
                            producer.sendOneway(message(opts, i));
                            Json.print(Json.obj("i", i, "status", "ONEWAY"));
                        } else {
                            Json.print(sent(i, producer.send(message(opts, i))));
                        }
                    } catch (Exception e) {
                        errors.incrementAndGet();
                        Json.print(failed(i, e));
                    }
                }
            }
        } finally {
            producer.shutdown();
        }
        Json.print(Json.obj("done", true, "count", count, "errors", errors.get()));
    }

    static Map<String, Object> sent(int i, SendResult result) {
        return Json.obj("i", i, "status", result.getSendStatus().name(), "msgId", result.getMsgId(),
            "offsetMsgId", result.getOffsetMsgId(), "brokerName",
            result.getMessageQueue().getBrokerName(), "queueId", result.getMessageQueue().getQueueId(),
            "queueOffset", result.getQueueOffset());
    }

    static Map<String, Object> failed(int i, Throwable e) {
        Map<String, Object> line = Json.obj("i", i, "error", e.getClass().getSimpleName(),
            "message", String.valueOf(e.getMessage()));
        // The broker's own words are in an MQBrokerException somewhere down the chain; the
        // client wraps them (and, after retries, summarises them) in MQClientExceptions.
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof MQBrokerException) {
                line.put("code", ((MQBrokerException) cause).getResponseCode());
                line.put("remark", ((MQBrokerException) cause).getErrorMessage());
                return line;
            }
        }
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof MQClientException && ((MQClientException) cause).getResponseCode() != -1) {
                line.put("code", ((MQClientException) cause).getResponseCode());
                line.put("remark", ((MQClientException) cause).getErrorMessage());
                return line;
            }
        }
        return line;
    }

    // --- consume ---------------------------------------------------------------------------

    static Map<String, Object> received(String consumer, MessageExt msg) {
        Map<String, Object> props = new LinkedHashMap<>(msg.getProperties());
        return Json.obj("consumer", consumer, "msgId", msg.getMsgId(), "offsetMsgId",
            msg instanceof org.apache.rocketmq.common.message.MessageClientExt
                ? ((org.apache.rocketmq.common.message.MessageClientExt) msg).getOffsetMsgId() : null,
            "topic", msg.getTopic(), "queueId", msg.getQueueId(), "queueOffset", msg.getQueueOffset(),
            "commitLogOffset", msg.getCommitLogOffset(), "brokerName", msg.getBrokerName(),
            "tags", msg.getTags(), "keys", msg.getKeys(), "reconsumeTimes", msg.getReconsumeTimes(),
            "bornTimestamp", msg.getBornTimestamp(), "storeTimestamp", msg.getStoreTimestamp(),
            "storeHost", String.valueOf(msg.getStoreHost()), "bodyCRC", msg.getBodyCRC(),
            "properties", props, "body", Base64.getEncoder().encodeToString(msg.getBody()));
    }

    /** Ends a consumer: at the expected count, after idle seconds without a message, or at the cap. */
    static final class Stop {
        final int expect;
        final long deadline;
        final long idleMillis;
        final AtomicInteger seen = new AtomicInteger();
        final AtomicLong last = new AtomicLong(System.currentTimeMillis());

        Stop(Options opts) {
            expect = opts.getInt("expect", Integer.MAX_VALUE);
            deadline = System.currentTimeMillis() + 1000L * opts.getInt("max-seconds", 60);
            idleMillis = 1000L * opts.getInt("idle-seconds", 0);
        }

        void saw(int n) {
            seen.addAndGet(n);
            last.set(System.currentTimeMillis());
        }

        boolean done() {
            long now = System.currentTimeMillis();
            return seen.get() >= expect || now > deadline
                || (idleMillis > 0 && seen.get() > 0 && now - last.get() > idleMillis);
        }
    }

    static void push(Options opts) throws Exception {
        String name = opts.get("name", "push-" + ProcessHandle.current().pid());
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(opts.require("group"));
        consumer.setNamesrvAddr(opts.require("namesrv"));
        consumer.setInstanceName(name);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        // Clustering (the default model): consumers of one group share the queues.
        consumer.setPersistConsumerOffsetInterval(1000);
        consumer.setAllocateMessageQueueStrategy(announcing(name));
        for (String topic : opts.require("topic").split(",")) {
            consumer.subscribe(topic, opts.get("tags", "*"));
        }
        if (opts.has("orderly")) {
            Stop stop = new Stop(opts);
            consumer.registerMessageListener((MessageListenerOrderly) (msgs, context) -> {
                for (MessageExt msg : msgs) {
                    Json.print(received(name, msg));
                }
                stop.saw(msgs.size());
                return ConsumeOrderlyStatus.SUCCESS;
            });
            consumer.start();
            Json.print(Json.obj("started", name));
            while (!stop.done()) {
                Thread.sleep(100);
            }
            consumer.shutdown();
            Json.print(Json.obj("done", true, "consumer", name, "received", stop.seen.get()));
            return;
        }
        boolean laterFirst = opts.has("later-first");
        // --always-later: every message fails, until the broker dead-letters it after
        // --max-reconsume retries.
        boolean alwaysLater = opts.has("always-later");
        if (opts.has("max-reconsume")) {
            consumer.setMaxReconsumeTimes(opts.getInt("max-reconsume", 16));
        }
        Map<String, Boolean> refused = new java.util.concurrent.ConcurrentHashMap<>();
        Stop stop = new Stop(opts);
        // --expect-later N: also stop once N deliveries were refused (RECONSUME_LATER), after
        // --linger-seconds for the last refusal's send-back to reach the broker.
        int expectLater = opts.getInt("expect-later", Integer.MAX_VALUE);
        AtomicInteger refusals = new AtomicInteger();
        java.util.concurrent.atomic.AtomicBoolean laterDone = new java.util.concurrent.atomic.AtomicBoolean();
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            for (MessageExt msg : msgs) {
                if (alwaysLater || laterFirst && refused.putIfAbsent(msg.getMsgId(), Boolean.TRUE) == null) {
                    Json.print(Json.obj("consumer", name, "later", msg.getMsgId(),
                        "reconsumeTimes", msg.getReconsumeTimes()));
                    if (refusals.incrementAndGet() >= expectLater) {
                        laterDone.set(true);
                    }
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
            }
            for (MessageExt msg : msgs) {
                Json.print(received(name, msg));
            }
            stop.saw(msgs.size());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        Json.print(Json.obj("started", name));
        while (!stop.done() && !laterDone.get()) {
            Thread.sleep(100);
        }
        if (laterDone.get()) {
            Thread.sleep(1000L * opts.getInt("linger-seconds", 0));
        }
        // shutdown() persists the consumed offsets to the broker before it returns.
        consumer.shutdown();
        Json.print(Json.obj("done", true, "consumer", name, "received", stop.seen.get()));
    }

    /**
     * The default allocation (averagely), with an {@code allocated} line for each topic at
     * each rebalance: the members it saw and the queues this consumer took. A test that wants
     * queues shared without duplicates waits for every member's share before it sends: a
     * message pulled by one member before a rebalance hands its queue to another is delivered
     * again from the committed offset (at-least-once, in RocketMQ as here).
     */
    static AllocateMessageQueueStrategy announcing(String name) {
        AllocateMessageQueueStrategy averagely = new AllocateMessageQueueAveragely();
        return new AllocateMessageQueueStrategy() {
            @Override
            public List<MessageQueue> allocate(String group, String currentCID, List<MessageQueue> mqAll,
                                               List<String> cidAll) {
                List<MessageQueue> mine = averagely.allocate(group, currentCID, mqAll, cidAll);
                String topic = mqAll.isEmpty() ? null : mqAll.get(0).getTopic();
                Json.print(Json.obj("allocated", name, "topic", topic, "members", cidAll.size(),
                    "queues", mine.size()));
                return mine;
            }

            @Override
            public String getName() {
                return averagely.getName();
            }
        };
    }

    static void pull(Options opts) throws Exception {
        String name = opts.get("name", "pull-" + ProcessHandle.current().pid());
        DefaultLitePullConsumer consumer =
            new DefaultLitePullConsumer(opts.require("group"), aclHook(opts));
        consumer.setNamesrvAddr(opts.require("namesrv"));
        consumer.setInstanceName(name);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAutoCommit(true);
        consumer.setAutoCommitIntervalMillis(1000);
        // Each queue's long-polled pull holds one of its pullThreadNums (20) threads for up to
        // 20 s, and the pool is sized in the constructor (a setter call here has no effect):
        // subscribe one consumer to at most 20 queues, or the rest wait that long.
        for (String topic : opts.require("topic").split(",")) {
            consumer.subscribe(topic, opts.get("tags", "*"));
        }
        consumer.start();
        Json.print(Json.obj("started", name));
        Stop stop = new Stop(opts);
        while (!stop.done()) {
            List<MessageExt> msgs = consumer.poll(500);
            for (MessageExt msg : msgs) {
                Json.print(received(name, msg));
            }
            if (!msgs.isEmpty()) {
                stop.saw(msgs.size());
            }
        }
        consumer.commitSync();
        consumer.shutdown();
        Json.print(Json.obj("done", true, "consumer", name, "received", stop.seen.get()));
    }

    // --- plumbing --------------------------------------------------------------------------

    /** {@code --key value} pairs (repeatable); a key followed by another key is a flag. */
    static final class Options {
        final Map<String, List<String>> values = new HashMap<>();

        static Options parse(String[] argv) {
            Options opts = new Options();
            for (int i = 1; i < argv.length; i++) {
                if (!argv[i].startsWith("--")) {
                    throw new IllegalArgumentException("expected --option, got " + argv[i]);
                }
                String key = argv[i].substring(2);
                String value = "true";
                if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) {
                    value = argv[++i];
                }
                opts.values.computeIfAbsent(key, k -> new ArrayList<>()).add(value);
            }
            return opts;
        }

        boolean has(String key) {
            return values.containsKey(key);
        }

        String get(String key, String fallback) {
            List<String> v = values.get(key);
            return v == null ? fallback : v.get(v.size() - 1);
        }

        String require(String key) {
            String v = get(key, null);
            if (v == null) {
                throw new IllegalArgumentException("--" + key + " is required");
            }
            return v;
        }

        int getInt(String key, int fallback) {
            String v = get(key, null);
            return v == null ? fallback : Integer.parseInt(v);
        }

        List<String> all(String key) {
            return values.getOrDefault(key, List.of());
        }
    }
}
