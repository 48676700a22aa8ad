package trioha.interop;

import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The few lines of JSON our programs print: objects of strings, numbers, booleans, maps and
 * lists. Written here rather than taken from the RocketMQ jars' fastjson so that the programs
 * print the same bytes against 4.x and 5.x.
 */
final class Json {
    private Json() {
    }

    /** What a program's main runs: its subcommand and options. */
    interface Command {
        void run(String command, Client.Options opts) throws Exception;
    }

    /**
     * Run a program's subcommand (the first argument) and end the JVM: 0 when it returns, 1
     * with a {@code fatal} line when it throws. The RocketMQ client's non-daemon threads
     * (netty, schedulers) outlive its shutdown() and would keep the JVM alive otherwise.
     */
    static void runToExit(String[] argv, Command body) {
        try {
            if (argv.length == 0) {
                throw new IllegalArgumentException("usage: <subcommand> --option value ...");
            }
            body.run(argv[0], Client.Options.parse(argv));
        } catch (Throwable e) {
            e.printStackTrace();
            print(obj("fatal", e.getClass().getSimpleName(), "message", String.valueOf(e.getMessage())));
            System.exit(1);
        }
        System.out.flush();
        System.exit(0);
    }

    static Map<String, Object> obj(Object... kv) {
        Map<String, Object> map = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            map.put((String) kv[i], kv[i + 1]);
        }
        return map;
    }

    /** One object on one line; synchronized so lines from callback threads never interleave. */
    static synchronized void print(Map<String, Object> map) {
        StringBuilder out = new StringBuilder();
        write(out, map);
        System.out.println(out);
        System.out.flush();
    }

    static void write(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(out, String.valueOf(e.getKey()));
                out.append(':');
                write(out, e.getValue());
            }
            out.append('}');
        } else if (value instanceof Collection) {
            out.append('[');
            boolean first = true;
            for (Object item : (Collection<?>) value) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(out, item);
            }
            out.append(']');
        } else {
            String s = value.toString();
            out.append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                if (c == '"' || c == '\\') {
                    out.append('\\').append(c);
                } else if (c < 0x20) {
                    out.append(String.format("\\u%04x", (int) c));
                } else {
                    out.append(c);
                }
            }
            out.append('"');
        }
    }
}
