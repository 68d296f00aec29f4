"""Test and benchmark harnesses (not shipped in the wheel): a loopback deployment."""
