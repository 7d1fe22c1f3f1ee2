"""A heap dump (HPDS) of any size through ddmd, written to disk as it arrives: ddmd's memory.

Runs ``ddmd run`` (a temporary config: the scan range holds one port, adb off, the default
[limits]: a dump streamed to disk is not bound by max_packet_bytes) and a simulated
VM (``ddmd sim --hprof-bytes SIZE``) whose HPDS answer is a generated dump of exactly SIZE bytes
pushed as one DDM chunk, streamed and never held whole. Asks ``POST /api/v1/vms/ID/hprof``,
samples ddmd's resident memory (VmRSS and VmHWM from /proc) every 50 ms while the dump flows,
and checks the file on disk: its size, and ddmd's own streaming HPROF reader's class counts.

    .venv/bin/python bench/hprof_stream.py [--bytes 3G]

Target: ddmd's peak RSS under 100 MB for a 1 GiB dump, and for a 3 GiB one (issue 21 item 4).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from rig import HOST
from rig.children import Child
from rig.daemon import ddmd_argv, scan_config, write_config
from rig.ports import Layout
from rig.proc import status_kb

from ddmd.protocol.hprof import summarise_file

TARGET_MB = 100.0


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", "--size", dest="size", default="1G", help="dump size (1G)")
    args = parser.parse_args()
    size = parse_size(args.size)
    layout = Layout.find(1, 2, 21000)
    vm_port, control = layout.scan.start, layout.control
    work = Path(tempfile.mkdtemp(prefix="ddmd-hprof-bench-"))
    config = work / "ddmd.toml"
    # No [limits]: the dump is one JDWP packet of SIZE + 19 bytes, over the default 1 GiB
    # max_packet_bytes from 1 GiB on; it streams to disk, so the cap does not apply to it.
    write_config(config, scan_config(layout, work / "ports.json", 0.5))
    python = sys.executable
    sim = Child(
        "sim",
        [
            python,
            "-m",
            "ddmd",
            "sim",
            "--port",
            str(vm_port),
            "--hprof-bytes",
            str(size),
            "--churn-interval",
            "0",
            "--gc-interval",
            "0",
        ],
    )
    ddmd = Child("ddmd", ddmd_argv("run", "--config", str(config), "--log-format", "json"))
    base = f"http://{HOST}:{control}"
    vm_id = f"tcp:{vm_port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                vms = httpx.get(base + "/api/v1/vms", trust_env=False, timeout=2).json()
                if any(v["id"] == vm_id and v["state"] == "ready" for v in vms):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(
                    "the simulated VM was not ready within 30 s:\n" + "\n".join(ddmd.stderr[-10:])
                )
            time.sleep(0.2)
        before = status_kb(ddmd.pid, "VmRSS")
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(status_kb(ddmd.pid, "VmRSS"))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        response = httpx.post(f"{base}/api/v1/vms/{vm_id}/hprof", trust_env=False, timeout=900)
        elapsed = time.monotonic() - start
        done.set()
        sampler.join()
        if response.status_code != 200:
            raise SystemExit(f"hprof failed: {response.status_code} {response.text}")
        body = response.json()
        path = work / "captures" / body["file"]
        on_disk = path.stat().st_size
        hwm = status_kb(ddmd.pid, "VmHWM")
        summary = summarise_file(path)
        rows = {r.name: r.instances for r in summary.classes}
        peak = max(samples) if samples else 0
        print(
            f"hprof_stream: a {size:,}-byte heap dump (HPDS) through ddmd, {elapsed:.1f} s "
            f"({size / elapsed / 1e6:.0f} MB/s)"
        )
        print(
            f"  file on disk: {on_disk:,} bytes "
            f"({'complete' if on_disk == size else 'WRONG SIZE'}); "
            f"ddmd's HPROF reader: {sum(rows.values()):,} objects, "
            f"{len(rows)} classes"
        )
        print(
            f"  ddmd RSS: {before / 1024:.1f} MB before, peak {peak / 1024:.1f} MB while the dump "
            f"flowed ({len(samples)} samples, every 50 ms); VmHWM {hwm / 1024:.1f} MB"
        )
        ok = on_disk == size and hwm / 1024 < TARGET_MB
        verdict = "PASS" if ok else "MISS"
        print(
            f"{verdict}  peak RSS (VmHWM) {hwm / 1024:.1f} MB < {TARGET_MB:.0f} MB for a "
            f"{size / (1 << 30):.2f} GiB dump"
        )
        return 0 if ok else 1
    finally:
        for child in (ddmd, sim):
            child.proc.terminate()
        for child in (ddmd, sim):
            try:
                child.proc.wait(timeout=10)
            except Exception:
                child.proc.kill()
        for file in (work / "captures").glob("*"):
            file.unlink()


if __name__ == "__main__":
    sys.exit(main())
