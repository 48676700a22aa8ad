"""Fault injection across real processes, with a checker that proves nothing acknowledged
is lost (``trio-ha chaos ...``).

Two kinds of runs:

* ``run``: a cluster started from the ``trio-ha`` executable (name server, a master and its
  slaves, each a process group with its own store), producers and consumers through the
  client library at bounded rates, and faults on a schedule drawn from a seed (SIGKILL and
  restart, SIGSTOP/SIGCONT pauses, broken links through a fault proxy; where the machine
  allows, partitions and packet loss between test hosts, full disks and clock jumps).
  Everything that happens is recorded in a history; the checker reads the history and the
  store files afterwards and says what held and what did not, with the seed to replay.

  Modules: ``plan`` (the configuration and the schedule), ``cluster`` (a node process),
  ``testnet``, ``disk`` and ``clockshift`` (what network, disk and clock faults are made
  of), ``faults`` (applying one fault), ``workload`` and ``history`` (the load and what it
  saw), ``checker`` (the verdict), ``run`` (a run from start to verdict).
* ``hostile``: attacks on the ports a peer can reach (malformed and mutated frames,
  slow and non-reading clients, connection floods, rogue replication peers); the node must
  stay up, keep serving a well-behaved client, and its store must verify clean.
  Modules: ``hostile`` (a package of the attacks, one module per attacker), ``fuzz_frames``
  and ``fuzz`` (the fuzzer's mutated frames, and sending them), ``hostile_run`` (a run
  against a cluster of processes) and ``hostile_report`` (its verdict).
"""
