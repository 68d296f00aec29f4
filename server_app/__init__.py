"""The ServerApp (app.py) and what it runs on.

In Flower's simulation this package is first imported on the ServerApp's own thread
while the main thread starts Ray: that thread waits here until Ray is up, before any
of the app's imports (pflower/patches/start_order.py)."""

from pflower.patches.start_order import serverapp_after_ray

serverapp_after_ray()
