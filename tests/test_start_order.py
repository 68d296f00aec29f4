"""``serverapp-after-ray`` (pflower/patches/start_order.py): on the thread Flower's
simulation starts its ServerApp on, the ServerApp's run waits until Ray is
initialized, so Ray forks its services while the run does nothing; anywhere else it
does not wait, and never while Flower's ``load_app`` holds its import lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from importlib import import_module
from pathlib import Path
from queue import Queue

from pflower.patches import start_order

flower_simulation = import_module("flwr.simulation.run_simulation")


class FakeRay(types.ModuleType):
    """``sys.modules['ray']`` whose ``is_initialized`` turns true when told."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.up = threading.Event()

    def is_initialized(self) -> bool:
        return self.up.is_set()


def _serverapp_thread(monkeypatch, body) -> tuple[threading.Thread, threading.Event]:
    """Flower's own ServerApp thread (``run_serverapp_th``), running ``body`` where
    Flower runs the ServerApp; started, with its stop event."""
    monkeypatch.setattr(flower_simulation, "_run", lambda **kwargs: body())
    stop = threading.Event()
    thread = flower_simulation.run_serverapp_th(
        server_app_attr=None,
        server_app=None,
        server_app_context=None,
        grid=None,
        app_dir="",
        f_stop=stop,
        exception_queue=Queue(),
        enable_tf_gpu_growth=False,
        ctx_queue=Queue(),
    )
    return thread, stop


def test_the_serverapp_thread_waits_for_ray_and_no_other_thread_does(monkeypatch) -> None:
    ray = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    seen: dict[str, float] = {}

    def body() -> None:
        seen["waited"] = start_order.serverapp_after_ray()
        seen["at"] = time.monotonic()

    thread, _ = _serverapp_thread(monkeypatch, body)
    time.sleep(0.3)  # Ray's start, on the main thread
    assert "at" not in seen  # still waiting
    assert start_order.serverapp_after_ray() == 0.0  # the main thread never waits
    up_at = time.monotonic()
    ray.up.set()
    thread.join(5)
    assert not thread.is_alive()
    assert seen["at"] >= up_at and seen["waited"] >= 0.3
    # once Ray is up, a ServerApp thread goes on at once
    thread, _ = _serverapp_thread(monkeypatch, body)
    thread.join(5)
    assert seen["waited"] < 0.1


def test_the_wait_ends_when_the_simulation_stops_or_after_the_longest(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "ray", FakeRay())  # never up
    seen: list[float] = []
    thread, stop = _serverapp_thread(
        monkeypatch, lambda: seen.append(start_order.serverapp_after_ray())
    )
    time.sleep(0.2)
    stop.set()  # the backend failed before Ray's start: Flower stops the simulation
    thread.join(5)
    assert not thread.is_alive() and seen and seen[0] >= 0.2
    thread, _ = _serverapp_thread(
        monkeypatch, lambda: seen.append(start_order.serverapp_after_ray(longest=0.1))
    )
    thread.join(5)
    assert not thread.is_alive() and 0.1 <= seen[1] < 2
    assert "waited 0 s for the Ray backend" in caplog.text


def test_threads_that_are_not_the_simulation_serverapp_do_not_wait(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", FakeRay())  # never up
    seen: list[float] = []
    other = threading.Thread(target=lambda: seen.append(start_order.serverapp_after_ray()))
    other.start()
    other.join(5)
    assert seen == [0.0]
    monkeypatch.delitem(sys.modules, "ray")  # Ray not imported at all: not up
    assert not start_order.ray_is_up()


def test_the_thread_flower_starts_is_the_one_recognized() -> None:
    """Read from the installed Flower (CI runs this on both lines; their wheels have
    the same ``run_serverapp_th``)."""
    consts = flower_simulation.run_serverapp_th.__code__.co_consts
    qualnames = {c.co_qualname for c in consts if isinstance(c, types.CodeType)}
    assert start_order.SERVERAPP_THREAD in qualnames


LOADS = """
import importlib, sys, threading, time, types
from queue import Queue

class FakeRay(types.ModuleType):
    def is_initialized(self):
        return False  # Ray never starts here: the ServerApp's run waits until stopped

sys.modules["ray"] = FakeRay("ray")
from flwr.common import Context, RecordDict
from flwr.supercore.object_ref import load_app

simulation = importlib.import_module("flwr.simulation.run_simulation")
root, stop, errors = sys.argv[1], threading.Event(), Queue()
context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
thread = simulation.run_serverapp_th(
    server_app_attr="server_app.app:app", server_app=None, server_app_context=context,
    grid=None, app_dir=root, f_stop=stop, exception_queue=errors,
    enable_tf_gpu_growth=False, ctx_queue=Queue(),
)
time.sleep(0.5)  # Flower's ServerApp thread is loading its app
start = time.monotonic()
load_app("client_app.app:app", ValueError, root)  # the main thread, before Ray's start
print(f"client app loaded in {time.monotonic() - start:.1f} s", flush=True)
time.sleep(1.0)
frame, calls = sys._current_frames().get(thread.ident), set()
while frame is not None:
    calls.add(frame.f_code.co_name)
    frame = frame.f_back
print("server app waiting in its run:", "serverapp_after_ray" in calls, flush=True)
stop.set()
thread.join(60)
print("server app ended:", not thread.is_alive(), flush=True)
"""


def test_loading_the_apps_as_flwr_run_does_waits_only_in_the_serverapps_run() -> None:
    """``flwr run`` loads each app by Flower's ``load_app``, which holds one lock for
    the import: the ServerApp's thread (started first) must not wait inside it, or the
    main thread's load of the ClientApp, before Ray's start, waits with it (a fresh
    interpreter: the apps imported for the first time, as in a run)."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", LOADS, str(root)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    loaded = float(out.split("client app loaded in ")[1].split(" s")[0])
    assert loaded < 60, out  # not the longest wait (300 s)
    assert "server app waiting in its run: True" in out  # past its import, for Ray
    assert "server app ended: True" in out  # until the simulation stopped
