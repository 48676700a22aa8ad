"""Which record engine loads, and that a missing or stale native build is never hidden."""

import os
import subprocess
import sys
import textwrap

import pytest

import trio_ha
from trio_ha import _backend


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "TRIO_HA_REQUIRE_NATIVE"}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        env=environment, timeout=120,
    )


BLOCK_NATIVE = "import sys; sys.modules['trio_ha._native'] = None\n"
STALE_NATIVE = textwrap.dedent("""
    import sys, types
    fake = types.ModuleType('trio_ha._native')
    fake.lib = types.SimpleNamespace(th_version=lambda: 999)
    fake.ffi = None
    sys.modules['trio_ha._native'] = fake
""")


def test_native_backend_is_reported():
    assert trio_ha.native_backend in ("native", "python")
    if os.environ.get("TRIO_HA_REQUIRE_NATIVE") == "1":
        assert trio_ha.native_backend == "native"


def test_missing_native_module_falls_back_to_python_engine_when_allowed():
    proc = run_python(BLOCK_NATIVE + "import trio_ha; print(trio_ha.native_backend)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "python"


def test_required_native_module_missing_is_an_error():
    proc = run_python(BLOCK_NATIVE + "import trio_ha", TRIO_HA_REQUIRE_NATIVE="1")
    assert proc.returncode != 0
    assert "NativeModuleError" in proc.stderr and "not built" in proc.stderr


def test_stale_native_module_is_rejected():
    proc = run_python(STALE_NATIVE + "import trio_ha; print(trio_ha.native_backend)")
    assert proc.stdout.strip() == "python"
    proc = run_python(STALE_NATIVE + "import trio_ha", TRIO_HA_REQUIRE_NATIVE="1")
    assert proc.returncode != 0 and "stale build: C version 999" in proc.stderr


def test_python_engine_runs_the_store(tmp_path):
    proc = run_python(
        BLOCK_NATIVE
        + f"""
import trio
from trio_ha import Message, StoreConfig, open_store, native_backend
assert native_backend == "python"
cfg = StoreConfig(store_path_root_dir={str(tmp_path)!r}, mapped_file_size_commit_log=8192,
                  mapped_file_size_consume_queue=200)
async def main():
    async with open_store(cfg) as store:
        for i in range(100):
            assert (await store.put_message(Message("P", b"x" * i, tags="t"))).ok
        assert (await store.put_messages([Message("P", b"b")] * 5)).ok
    async with open_store(cfg) as store:
        msgs = await store.get_messages("P", 0, 0, 200)
        assert [len(m.body) for m in msgs[:100]] == list(range(100)), msgs[:3]
        assert len(msgs) == 105 and all(m.crc_ok for m in msgs)
        print("ok", store.statistics().segments)
trio.run(main)
"""
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


@pytest.mark.skipif(_backend.native_backend != "native", reason="native module not built")
def test_native_version_matches_header():
    with open(os.path.join(os.path.dirname(__file__), "..", "native", "trio_ha_native.h")) as f:
        header = f.read()
    assert f"#define TH_NATIVE_VERSION {_backend.NATIVE_VERSION}" in header
