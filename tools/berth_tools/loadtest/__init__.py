"""Client-side load measurements of a running Berth API (no server code here)."""
