"""How long `ddmd gc` and `ddmd heap --segments` take on each VM family (protocol.md 2.2).

Run: ``.venv/bin/python bench/quiet_requests.py [--rounds 10]``

Starts, as separate processes, four simulated VMs (``ddmd sim``) and ``ddmd run`` scanning
them:

- ``art``: ART 9+ without its agent (a current phone): no reply at all to HPGC, HPSG, HPIF;
- ``legacy``: Dalvik / ART 5-8: empty replies;
- ``fail``: ART 9+ that answers FAIL to HPGC and HPSG;
- ``modern``: Android 12+, the heap and thread handlers gone.

For ``art`` and ``legacy`` it runs ``ddmd gc TARGET --json`` and then
``ddmd heap TARGET --segments --json`` ``--rounds`` times each, as a user would (whole CLI
processes), and also times the same requests against the control API alone. Every answer is
checked: the GC confirmed, the dump's used bytes equal to the VM's allocated bytes, nothing
marked unsupported. For ``fail`` and ``modern`` it checks the refusal sentences and times them.

Target (issue: real Android behaviour): ``ddmd gc`` under 1 s on a VM that never replies.
Prints figures and PASS/MISS; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rig import HOST, ROOT
from rig.children import Child
from rig.daemon import ddmd_argv, scan_config, write_config
from rig.ports import Layout

GC_TARGET = 1.0  # seconds, whole `ddmd gc` command


def cli(control: int, *args: str) -> tuple[float, int, dict[str, Any] | None, str]:
    argv = [sys.executable, "-m", "ddmd", *args, "--control", f"{HOST}:{control}"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - t0
    try:
        body = json.loads(done.stdout) if done.stdout.strip() else None
    except ValueError:
        body = None
    return took, done.returncode, body, done.stderr.strip()


def wait_vms(client: httpx.Client, ids: list[str], ddmd: Child, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ddmd.check_alive()
        try:
            vms = {v["id"]: v for v in client.get("/api/v1/vms").json()}
        except (httpx.HTTPError, ValueError):
            vms = {}
        ready = [i for i in ids if i in vms and vms[i]["state"] == "ready" and vms[i]["ddm"]]
        # Heap info for the two that have it; the modern one must have been judged.
        settled = all(vms[i]["heaps"] or "HPIF" in vms[i]["unsupported"] for i in ready)
        if len(ready) == len(ids) and settled:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"VMs not ready after {timeout:g} s: {sorted(vms)}")
        time.sleep(0.2)


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):7.1f} {1000 * max(values):7.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    flavors = [("art", []), ("legacy", []), ("fail", ["--fail", "HPGC,HPSG"]), ("modern", [])]
    layout = Layout.find(len(flavors), len(flavors), 20000)
    base, control = layout.scan.start, layout.control
    work = Path(tempfile.mkdtemp(prefix="ddmd-quiet-"))
    config = work / "ddmd.toml"
    sections = scan_config(layout, config.with_suffix(".ports.json"), 0.5)
    # as monitor_scale.py's: every VM's threads polled at 2 Hz, heap info on
    sections["monitor"] = {"thread_poll_interval": 0.5, "always_poll_threads": True}
    sections["monitor"]["heap_info"] = True
    write_config(config, {**sections, "limits": {"max_vms": 16}})
    children: list[Child] = []
    ids = {name: f"tcp:{base + i}" for i, (name, _) in enumerate(flavors)}
    ok = True
    try:
        for i, (name, extra) in enumerate(flavors):
            flavor = "art" if name == "fail" else name
            argv = [sys.executable, "-m", "ddmd", "sim", "--port", str(base + i)]
            argv += ["--flavor", flavor, "--pid", str(4000 + i), "--app", f"com.bench.{name}"]
            argv += ["--gc-interval", "0", "--churn-interval", "0"]
            children.append(Child(f"sim {name}", [*argv, *extra]))
        log = (work / "ddmd.log").open("w")
        ddmd = Child("ddmd", ddmd_argv("run", "--config", str(config)), stdout=log)
        children.append(ddmd)
        with httpx.Client(base_url=f"http://{HOST}:{control}", timeout=30) as client:
            wait_vms(client, list(ids.values()), ddmd)
            print(
                f"{'VM':8} {'operation':16} {'n':>3} {'API ms med/max':>16} "
                f"{'CLI ms med/max':>16}  result"
            )
            for name in ("art", "legacy"):
                target = ids[name]
                api_gc, api_heap, cli_gc, cli_heap = [], [], [], []
                problems: list[str] = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    r = client.post(f"/api/v1/vms/{target}/gc")
                    api_gc.append(time.perf_counter() - t0)
                    if r.status_code != 200 or not r.json()["confirmed"]:
                        problems.append(f"API gc: {r.status_code} {r.text[:120]}")
                    took, code, body, err = cli(control, "gc", target, "--json")
                    cli_gc.append(took)
                    if code != 0 or not body or not body["confirmed"]:
                        problems.append(f"ddmd gc: exit {code} {err[:120]}")
                    t0 = time.perf_counter()
                    r = client.get(f"/api/v1/vms/{target}/heap", params={"segments": "1"})
                    api_heap.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        problems.append(f"API heap: {r.status_code} {r.text[:120]}")
                    took, code, body, err = cli(control, "heap", target, "--segments", "--json")
                    cli_heap.append(took)
                    if code != 0 or not body:
                        problems.append(f"ddmd heap: exit {code} {err[:120]}")
                    else:
                        used = body["images"][0]["summary"]["bytes_used"]
                        allocated = body["heaps"][0]["bytes_allocated"]
                        if used != allocated:
                            problems.append(f"used {used} != allocated {allocated}")
                vm = client.get(f"/api/v1/vms/{target}").json()["vm"]
                if vm["unsupported"]:
                    problems.append(f"marked unsupported: {vm['unsupported']}")
                fast = max(cli_gc) < GC_TARGET
                verdict = "ok" if not problems else "; ".join(problems[:3])
                print(
                    f"{name:8} {'gc':16} {len(api_gc):3} {ms(api_gc):>16} {ms(cli_gc):>16}  "
                    f"{'PASS' if fast and not problems else 'MISS'} (< {GC_TARGET:g} s) {verdict}"
                )
                print(
                    f"{name:8} {'heap --segments':16} {len(api_heap):3} {ms(api_heap):>16} "
                    f"{ms(cli_heap):>16}  {verdict}"
                )
                ok = ok and fast and not problems
            for name, path, method, want in (
                ("fail", "/gc", "POST", 501),
                ("fail", "/heap?segments=1", "GET", 501),
                ("modern", "/heap?segments=1", "GET", 501),
                ("modern", "/gc", "POST", 200),
            ):
                t0 = time.perf_counter()
                r = client.request(method, f"/api/v1/vms/{ids[name]}{path}")
                took = time.perf_counter() - t0
                body = r.json()
                said = body.get("error") or body.get("note") or body.get("gc")
                good = r.status_code == want
                ok = ok and good
                print(
                    f"{name:8} {path:16} {1:3} {1000 * took:16.1f} {'':>16}  "
                    f"{'ok' if good else 'MISS'} {r.status_code}: {said}"
                )
    finally:
        for child in reversed(children):
            child.stop()
    print("PASS" if ok else "MISS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
