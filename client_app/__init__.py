"""The client side: the ClientApp, its NumPyClients and their training loops."""

from client_app import timing  # noqa: F401  (first: it notes when the app import began)
