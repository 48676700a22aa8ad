"""The command line as a newcomer meets it."""

import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio


def flat(text: str) -> str:
    """An error as one line: typer's box and its line breaks removed."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", *args], capture_output=True, text=True, cwd=cwd,
        timeout=120,
    )


def test_demo_puts_restarts_and_reads_back(tmp_path):
    store = tmp_path / "demo"
    first = run_cli("store-demo", "--dir", str(store), "--count", "50", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "{'PUT_OK'}" in first.stdout and "DemoTopic/0 holds 50 messages" in first.stdout
    second = run_cli("store-demo", "--dir", str(store), "--count", "50", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "after a clean stop" in second.stdout
    assert "DemoTopic/0 holds 100 messages" in second.stdout
    assert "hello #99 from trio-ha" in second.stdout


def test_help_lists_commands(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("store-demo", "dev-cluster", "namesrv", "broker", "controller", "bench"):
        assert command in result.stdout


def test_dev_cluster_demo_round_trip_and_clean_stop(tmp_path):
    result = run_cli(
        "dev-cluster", "--dir", str(tmp_path / "dc"), "--namesrv-port", "0", "--master-port", "0",
        "--slave-port", "0", "--demo", "--duration", "2", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "produced 100 messages" in out and "['SEND_OK']" in out
    assert "consumed 100 messages back" in out
    assert "lag 0 B, HA transfer" in out
    assert "cluster stopped cleanly" in out


def test_dev_cluster_controller_demo_fails_over_and_stops_cleanly(tmp_path):
    """`dev-cluster --controller --demo` (what bin/run shows): the name server embeds the
    controller, three brokers in child processes take their roles from it, the master is
    SIGKILLed, a slave is elected at a higher epoch and answers SEND_OK, everything
    acknowledged is read back, the old master rejoins; the status lines show the controller's
    view; leaving stops every child."""
    data = tmp_path / "dc"
    result = run_cli(
        "--log-level", "warning", "dev-cluster", "--controller", "--dir", str(data),
        "--namesrv-port", "0", "--controller-port", "0", "--master-port", "0",
        "--slave-port", "0", "--demo", "--duration", "2", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    brokers = re.findall(r"^broker +(\S+) +broker-a, pid (\d+), conf (\S+)$", out, re.M)
    assert len(brokers) == 3, out
    epochs = re.search(r"master epoch (\d+) -> (\d+)$", out, re.M)
    assert epochs and int(epochs[2]) > int(epochs[1]) >= 1, out
    killed = re.search(r"SIGKILL the master (\S+) \(pid (\d+)\)", out)
    assert killed and killed[1] in {addr for addr, _, _ in brokers}, out
    first = re.search(r"first SEND_OK from the new master (\S+) ([\d.]+) s after the kill", out)
    assert first and first[1] != killed[1] and first[1] in {a for a, _, _ in brokers}, out
    assert re.search(r"read back (\d+) messages: all 100 acknowledged sends are there", out)
    restarted = re.search(rf"restarted the old master {killed[1]} \(pid (\d+)\)", out)
    assert restarted, out
    # the status lines: the controller's view beside the brokers'
    views = [line for line in out.splitlines() if line.startswith("broker-a: master")
             and "(in-sync set epoch" in line]
    assert views and f"epoch {epochs[2]} " in views[-1] and first[1] in views[-1], out
    assert views[-1].count("127.0.0.1:") == 4, views[-1]  # the master, and 3 in sync
    assert "controller leader 127.0.0.1:" in out
    assert "cluster stopped cleanly" in out
    assert not os.path.exists(f"/proc/{restarted[1]}"), "the restarted broker outlived it"
    for addr, pid, conf in brokers:
        name = os.path.basename(conf)[: -len(".conf")]
        assert (data / name / "commitlog").is_dir() and (data / "logs" / f"{name}.log").exists()
        assert f"listenPort={addr.rsplit(':', 1)[1]}" in Path(conf).read_text()
        assert not os.path.exists(f"/proc/{pid}"), f"broker {name} (pid {pid}) outlived it"
    assert (data / "controller").is_dir()


def test_dev_cluster_grows_groups_slaves_and_modes(tmp_path):
    """Two broker groups with two slaves each, ASYNC_MASTER and SYNC_FLUSH: the demo topic is
    spread over both masters, every slave catches up, each group's store has its own
    directory."""
    result = run_cli(
        "--log-level", "warning", "dev-cluster", "--dir", str(tmp_path / "dc"),
        "--namesrv-port", "0", "--master-port", "0", "--slave-port", "0",
        "--broker-groups", "2", "--slaves", "2", "--async-master", "--sync-flush", "--demo",
        "--duration", "3", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    masters = [line for line in out.splitlines() if line.startswith("ASYNC_MASTER")]
    assert len(masters) == 2 and all("SYNC_FLUSH" in line for line in masters), out
    assert [line.split()[-2:] for line in masters] == [["broker-a,", "SYNC_FLUSH"],
                                                        ["broker-b,", "SYNC_FLUSH"]], out
    assert sum(line.startswith("SLAVE") for line in out.splitlines()) == 4
    assert "DemoTopic has 4 queues on each of broker-a, broker-b" in out
    assert "consumed 100 messages back" in out
    for name in ("broker-a", "broker-b"):
        status = [line for line in out.splitlines() if line.startswith(f"{name} ASYNC_MASTER")]
        assert status, out
        assert "slave1: " in status[-1] and "slave2: " in status[-1]
        assert status[-1].count("lag 0 B") == 2, status[-1]
        for store in ("master", "slave1", "slave2"):
            assert (tmp_path / "dc" / name / store / "commitlog").is_dir()
    assert "cluster stopped cleanly" in out


def _first_line(proc: subprocess.Popen, timeout: float = 30) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout} s"
    return proc.stdout.readline()


def test_namesrv_and_broker_commands_serve_until_sigterm(tmp_path):
    """`trio-ha namesrv` and `trio-ha broker -c broker.conf`, as an operator runs them: each
    says where it serves, serves there, and stops cleanly on SIGTERM."""
    procs = []

    def start(*args):
        proc = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", *args], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    try:
        namesrv = start("namesrv", "--port", "0", "--bind", "127.0.0.1")
        listening = re.fullmatch(r"name server listening on (\S+):(\d+)\n", _first_line(namesrv))
        assert listening, "the name server did not say where it listens"
        conf = tmp_path / "broker.conf"
        conf.write_text(
            "brokerRole=SYNC_MASTER\nlistenPort=0\nbindAddress=127.0.0.1\n"
            f"haBindAddress=127.0.0.1\nstorePathRootDir={tmp_path / 'store'}\n"
            f"mappedFileSizeCommitLog=1048576\nnamesrvAddr=127.0.0.1:{listening[2]}\n"
        )
        broker = start("broker", "-c", str(conf))
        serving = re.fullmatch(r"broker broker-a \(SYNC_MASTER\) serving on 127\.0\.0\.1:(\d+), "
                               r"HA 127\.0\.0\.1:(\d+)\n", _first_line(broker))
        assert serving, "the broker did not say where it serves"
        for port in (listening[2], serving[1], serving[2]):
            socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        for proc in (broker, namesrv):
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "shutting down" in out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_a_broker_conf_with_a_typo_or_an_unsupported_feature_is_refused(tmp_path):
    """A misspelt key is named with the key it resembles, not silently replaced by a default;
    a malformed name server address is refused at parse time, not after the broker says it
    serves; a RocketMQ feature this broker lacks (DLedger) is refused, not quietly run
    without. Nothing starts: no store is made."""
    store = tmp_path / "store"
    base = f"storePathRootDir={store}\nlistenPort=0\nbindAddress=127.0.0.1\n"
    for line, words in (("lisenPort=10911", ["unknown key 'lisenPort'", "'listenPort'"]),
                        ("namesrvAddr=not-an-address", ["'not-an-address' is not host:port"]),
                        ("brokerRol=SLAVE", ["unknown key 'brokerRol'", "'brokerRole'"]),
                        ("enableDLegerCommitLog=true", ["enableDLegerCommitLog=true",
                                                        "DLedger"])):
        conf = tmp_path / "broker.conf"
        conf.write_text(base + line + "\n")
        done = run_cli("broker", "-c", str(conf), cwd=tmp_path)
        assert done.returncode != 0
        for word in words:
            assert word in flat(done.stderr), done.stderr
        assert "Traceback" not in done.stderr
        assert not store.exists()


def test_rocketmq_tuning_keys_are_accepted_and_named(caplog):
    from trio_ha.broker import BrokerConfig

    with caplog.at_level(logging.WARNING):
        config = BrokerConfig.from_properties(
            "sendMessageThreadPoolNums=16\nuseReentrantLockWhenPutMessage=true\n"
            "adminBrokerThreadPoolNums=4\nlistenPort=10921\n")
    assert config.listen_port == 10921
    assert ("ignored: adminBrokerThreadPoolNums, sendMessageThreadPoolNums, "
            "useReentrantLockWhenPutMessage"
            in caplog.text)


def test_version_and_short_help(tmp_path):
    from trio_ha import __version__

    done = run_cli("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith(f"trio-ha {__version__} ")
    done = run_cli("broker", "-h", cwd=tmp_path)
    assert done.returncode == 0 and "--namesrv-addr" in done.stdout


def test_broker_namesrv_address_from_the_command_line_the_file_or_the_environment(tmp_path):
    """As mqbroker: -n wins over the file's namesrvAddr, which wins over $NAMESRV_ADDR;
    -p prints every setting and -m the main ones, and exit without starting."""
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nbrokerName=b7\n")
    env_only = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "broker", "-c", str(conf), "-p"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={**os.environ, "NAMESRV_ADDR": "10.0.0.9:9876"})
    assert env_only.returncode == 0, env_only.stderr
    assert "namesrvAddr=10.0.0.9:9876" in env_only.stdout.splitlines()
    assert "brokerName=b7" in env_only.stdout.splitlines()
    conf.write_text(conf.read_text() + "namesrvAddr=10.0.0.8:9876\n")
    from_file = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "broker", "-c", str(conf), "-m"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={**os.environ, "NAMESRV_ADDR": "10.0.0.9:9876"})
    assert "namesrvAddr=10.0.0.8:9876" in from_file.stdout.splitlines()
    assert len(from_file.stdout.splitlines()) == 11  # the main settings only
    flag = run_cli("broker", "-c", str(conf), "-n", "10.0.0.7:9876", "-m", cwd=tmp_path)
    assert "namesrvAddr=10.0.0.7:9876" in flag.stdout.splitlines()
    assert not (tmp_path / "store").exists()  # printing starts nothing


def test_a_missing_or_directory_config_file_is_one_clear_error(tmp_path):
    for path, reason in ((tmp_path / "nope.conf", "No such file"), (tmp_path, "Is a directory")):
        done = run_cli("broker", "-c", str(path), cwd=tmp_path)
        assert done.returncode == 2
        assert "cannot read" in flat(done.stderr) and reason in flat(done.stderr), done.stderr
        assert "Traceback" not in done.stderr


def test_a_store_in_use_and_a_port_taken_are_one_line_each(tmp_path):
    """Two expected failures as an operator meets them: a second broker on the same store,
    and a broker on a port another holds. One line naming the store or the port, exit 1, no
    traceback (``--debug`` shows it); the failed start writes nothing but the lock."""
    base = "bindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\nvipChannelEnable=false\n"
    first_conf = tmp_path / "first.conf"
    first_conf.write_text(base + f"listenPort=0\nstorePathRootDir={tmp_path / 'store'}\n")
    first = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", "broker", "-c",
                              str(first_conf)], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        serving = re.search(r"serving on 127\.0\.0\.1:(\d+)", _first_line(first))
        assert serving, "the first broker did not start"
        # Same store and the same port: the lock is taken before any port is bound, so the
        # answer is the store in use, not the port taken.
        same = tmp_path / "same.conf"
        same.write_text(base + f"listenPort={serving[1]}\n"
                               f"storePathRootDir={tmp_path / 'store'}\n")
        again = run_cli("broker", "-c", str(same), cwd=tmp_path)
        assert again.returncode == 1 and "Traceback" not in again.stderr
        assert again.stderr.startswith("trio-ha: store ") and "in use" in again.stderr
        assert again.stderr.count("\n") == 1, again.stderr

        taken = tmp_path / "taken.conf"
        taken.write_text(base + f"listenPort={serving[1]}\n"
                                f"storePathRootDir={tmp_path / 'other'}\n")
        done = run_cli("broker", "-c", str(taken), cwd=tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert f"cannot listen on 127.0.0.1:{serving[1]}, listenPort" in done.stderr, \
            done.stderr
        # The lock came first (its directory and file); nothing else was written.
        assert sorted(os.listdir(tmp_path / "other")) == ["lock"]
        debug = run_cli("--debug", "broker", "-c", str(taken), cwd=tmp_path)
        assert debug.returncode != 0 and "Traceback" in debug.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)


def _start_broker(conf, cwd, *global_options):
    proc = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", *global_options, "broker",
                             "-c", str(conf)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = _first_line(proc)
    if "serving on" not in line:
        proc.kill()
        raise AssertionError(f"the broker did not start: {line}{proc.communicate()[1]}")
    return proc


def _store_files(store) -> dict[str, bytes]:
    """Every file of a store directory but the lock, with its bytes."""
    return {str(path.relative_to(store)): path.read_bytes()
            for path in sorted(store.rglob("*")) if path.is_file() and path.name != "lock"}


def test_a_taken_ha_port_stops_the_start_with_the_store_as_it_was(tmp_path):
    """The HA port is bound before recovery runs and before the abort file is written: a
    start that cannot bind it leaves every file as it was, so the next start is not taken
    for a crash (the operator's report: a failed HA bind left an abort file behind)."""
    store = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    base = ("bindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\nlistenPort=0\n"
            f"storePathRootDir={store}\nmappedFileSizeCommitLog=1048576\n")
    conf.write_text(base + "haListenPort=0\n")
    first = _start_broker(conf, tmp_path)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=30)
    assert first.returncode == 0 and not (store / "abort").exists()
    before = _store_files(store)
    assert "commitlog/00000000000000000000" in before

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        conf.write_text(base + f"haListenPort={taken}\n")
        done = run_cli("broker", "-c", str(conf), cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{taken}, haListenPort" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert _store_files(store) == before  # no abort file, nothing recovered or rewritten


def _log_events(path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigterm_leaves_no_abort_file_and_sigkill_leaves_one_for_crash_recovery(tmp_path):
    """A broker stopped by SIGTERM drains, flushes and removes its abort file, so the next
    start takes the normal path; one SIGKILLed leaves the file, and the next start recovers
    as after a crash. Read from the JSON log the broker writes (``--log-format json
    --log-file``), whose every line is an object with a time, a level and a logger."""
    store = tmp_path / "store"
    conf = tmp_path / "broker.conf"
    conf.write_text("bindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\nlistenPort=0\n"
                    f"storePathRootDir={store}\nmappedFileSizeCommitLog=1048576\n")
    log_file = tmp_path / "broker.log"
    options = ("--log-format", "json", "--log-file", str(log_file))

    def recoveries() -> list[str]:
        return [e["message"] for e in _log_events(log_file)
                if e["logger"] == "trio_ha.store.opening" and "recovered" in e["message"]]

    broker = _start_broker(conf, tmp_path, *options)
    assert (store / "abort").exists()  # present while the store is open
    broker.send_signal(signal.SIGTERM)
    broker.communicate(timeout=30)
    assert broker.returncode == 0 and not (store / "abort").exists()

    broker = _start_broker(conf, tmp_path, *options)
    assert "after a clean stop" in recoveries()[-1]
    broker.kill()
    broker.communicate(timeout=30)
    assert (store / "abort").exists()

    broker = _start_broker(conf, tmp_path, *options)
    try:
        assert "after a crash" in recoveries()[-1]
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.communicate(timeout=30)
    assert not (store / "abort").exists()
    events = _log_events(log_file)
    assert {"time", "level", "logger", "message"} <= set(events[0])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", events[0]["time"])
    messages = [e["message"] for e in events]
    assert sum("serving on" in m for m in messages) == 3
    assert any(m.startswith("HA service listening on 127.0.0.1:") for m in messages)


def test_the_human_log_has_time_and_level_and_the_level_option_filters(tmp_path):
    """By default each log line starts with its date, time and level; ``--log-level
    warning`` leaves the INFO lines out."""
    store = tmp_path / "store"
    info = run_cli("store-demo", "--dir", str(store), "--count", "3", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    line = next(x for x in info.stderr.splitlines() if "recovered" in x)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO  trio_ha\.store\.opening: "
                    r"store \S+ recovered after a clean stop", line), line
    quiet = run_cli("--log-level", "warning", "store-demo", "--dir", str(store), "--count", "3",
                    cwd=tmp_path)
    assert quiet.returncode == 0 and "recovered" not in quiet.stderr, quiet.stderr
    bad = run_cli("--log-file", str(tmp_path / "no" / "such" / "dir.log"), "store-demo",
                  "--dir", str(store), cwd=tmp_path)
    assert bad.returncode == 1 and "cannot open the log file" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_namesrv_conf_file_typos_print_config_and_metrics_endpoints(tmp_path):
    """``trio-ha namesrv -c namesrv.conf`` takes RocketMQ's keys (a typo is named, tuning keys
    are accepted), ``-p`` prints the settings, and ``--metrics-port`` on the name server and
    the broker serves Prometheus text at /metrics."""
    conf = tmp_path / "namesrv.conf"
    conf.write_text("listenPort=0\norderMessageEnable=true\nserverWorkerThreads=8\n"
                    f"kvConfigPath={tmp_path / 'kv.json'}\n")
    printed = run_cli("namesrv", "-c", str(conf), "-p", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "orderMessageEnable=true" in printed.stdout and "listenPort=0" in printed.stdout
    typo = tmp_path / "typo.conf"
    typo.write_text("listenPrt=9876\n")
    refused = run_cli("namesrv", "-c", str(typo), cwd=tmp_path)
    assert refused.returncode == 2 and "'listenPort'" in flat(refused.stderr), refused.stderr

    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    log = tmp_path / "namesrv.log"
    namesrv = subprocess.Popen(
        [sys.executable, "-m", "trio_ha.cli", "--log-file", str(log), "namesrv", "-c",
         str(conf), "--bind", "127.0.0.1", "--metrics-port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    broker = None
    try:
        listening = re.fullmatch(r"name server listening on (\S+)\n", _first_line(namesrv))
        assert listening
        metrics_line = next(line for line in log.read_text().splitlines()
                            if "metrics at http://" in line)
        namesrv_metrics = metrics_line.rsplit("metrics at ", 1)[1]
        broker_conf = tmp_path / "broker.conf"
        broker_conf.write_text("listenPort=0\nbindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\n"
                               f"storePathRootDir={tmp_path / 'store'}\n"
                               f"mappedFileSizeCommitLog=1048576\nnamesrvAddr={listening[1]}\n")
        broker = subprocess.Popen(
            [sys.executable, "-m", "trio_ha.cli", "broker", "-c", str(broker_conf),
             "--metrics-port", "0"], cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        serving = re.search(r"metrics (http://\S+/metrics)", _first_line(broker))
        assert serving, "the broker did not say where its metrics are"
        for url, series in ((serving[1], "trio_ha_commitlog_max_offset"),
                            (namesrv_metrics, "trio_ha_namesrv_brokers")):
            with urlopen(url, timeout=10) as answer:
                text = answer.read().decode()
            names = {family.name for family in text_string_to_metric_families(text)}
            assert series in names, (url, sorted(names))
    finally:
        for proc in (broker, namesrv):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=30)


def test_broker_ip1_defaults_to_the_bound_address_or_this_hosts_own(tmp_path, caplog):
    """A stock broker.conf without brokerIP1 registers an address other hosts can reach
    (RocketMQ's choice of this host's first non-loopback address), not 127.0.0.1; a broker
    bound to one address registers that one; an explicit brokerIP1 wins; and a broker that
    has no name server to register with says so."""
    from trio_ha._sockets import local_address
    from trio_ha.broker import BrokerConfig

    assert BrokerConfig.from_properties("listenPort=10911").broker_ip1 == local_address()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # (no packet is sent) the way out, if any
            outbound = probe.getsockname()[0]
        except OSError:
            outbound = None
    if outbound is not None and not outbound.startswith("127."):
        assert not local_address().startswith("127.")  # a host with a way out: not loopback
    bound = BrokerConfig.from_properties("bindAddress=127.0.0.1")
    assert bound.broker_ip1 == "127.0.0.1" and bound.store.store_host == "127.0.0.1:10911"
    assert BrokerConfig.from_properties("brokerIP1=10.1.2.3").broker_ip1 == "10.1.2.3"
    printed = run_cli("broker", "-c", str(_conf(tmp_path, "listenPort=10911\n")), "-m",
                      cwd=tmp_path)
    assert f"brokerIP1={local_address()}" in printed.stdout, printed.stdout

    lonely = _conf(tmp_path, "listenPort=0\nbindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\n"
                             f"storePathRootDir={tmp_path / 'store'}\n")
    broker = _start_broker(lonely, tmp_path, "--log-file", str(tmp_path / "broker.log"))
    broker.send_signal(signal.SIGTERM)
    broker.communicate(timeout=30)
    assert "no namesrvAddr" in (tmp_path / "broker.log").read_text()


def _conf(tmp_path, text: str):
    path = tmp_path / f"conf{len(list(tmp_path.glob('conf*')))}.conf"
    path.write_text(text)
    return path


def test_a_store_directory_that_cannot_be_made_is_one_line(tmp_path):
    """storePathRootDir under a file (the tests run as root here, so a permission cannot be
    taken away; the path is what an operator mistypes): one line naming the path, exit 1,
    nothing written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    conf = _conf(tmp_path, "listenPort=0\nbindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\n"
                           f"storePathRootDir={blocker / 'store'}\n")
    done = run_cli("broker", "-c", str(conf), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"trio-ha: Not a directory: {blocker / 'store'}\n", done.stderr
    assert blocker.read_text() == "not a directory\n"


def test_a_second_signal_stops_a_node_whose_graceful_stop_hangs(tmp_path):
    """The runner every node command uses: the first SIGTERM cancels the node for its
    graceful stop; when that stop hangs (here: a shutdown step that never finishes), a second
    signal ends the process at once, with 128 + the signal's number."""
    script = tmp_path / "hanging_node.py"
    script.write_text(
        "import trio\n"
        "from trio_ha.cli._app import run_until_interrupted\n"
        "async def main():\n"
        "    try:\n"
        "        print('serving', flush=True)\n"
        "        await trio.sleep_forever()\n"
        "    finally:\n"
        "        with trio.CancelScope(shield=True):\n"
        "            await trio.sleep(600)  # a drain that never ends\n"
        "run_until_interrupted(main)\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert _first_line(proc) == "serving\n"
        proc.send_signal(signal.SIGTERM)
        assert _first_line(proc).startswith("shutting down")
        assert proc.poll() is None  # still draining
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "forced to stop" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


async def test_the_failover_demo_names_the_step_that_did_not_happen(autojump_clock):
    """Each step of the failover demo has a deadline; one that passes is one clear error
    naming the step and the last failure seen (the CLI prints it as one line)."""
    from trio_ha._errors import TrioHAError
    from trio_ha.client import MQClientError
    from trio_ha.demo import DemoError, _until

    async def never():
        return None

    with pytest.raises(DemoError, match=r"^the election did not happen within 60 s$"):
        await _until(60, "the election", never)

    async def refused():
        raise MQClientError("no route")

    with pytest.raises(DemoError, match=r"SEND_OK did not happen within 5 s \(last: no route\)"):
        await _until(5, "SEND_OK", refused)
    assert issubclass(DemoError, TrioHAError)

    async def soon():
        return "elected" if trio.current_time() >= 3 else None

    assert await _until(60, "the election", soon) == "elected"
