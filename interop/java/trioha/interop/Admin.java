package trioha.interop;

import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * mqadmin itself ({@code MQAdminStartup.main}), then the end of the JVM as soon as it returns.
 *
 * <p>The real launcher runs the same main and exits when the last non-daemon thread ends: the
 * admin client's netty event loops, which wait out netty's two-second quiet period after the
 * command is done. The exit status is the launcher's: 0 when main returns, 1 when it throws.
 * Only the idle two seconds go (the interop tests run mqadmin dozens of times).
 */
public final class Admin {
    private Admin() {
    }

    public static void main(String[] args) {
        try {
            MQAdminStartup.main(args);
        } catch (Throwable e) {
            e.printStackTrace();
            System.exit(1);
        }
        System.out.flush();
        System.exit(0);
    }
}
