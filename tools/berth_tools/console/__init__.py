"""``berth ui``: a web console on 127.0.0.1 that signs its API calls with the user's own AWS
credentials, as the CLI does (docs/console.md)."""
