"""Engines behind a router, and the rollout's side of it.

* labkit.serving.cluster: `labkit serve`, K engine servers and vllm-router on loopback;
* labkit.serving.processes: child processes in their own groups (ports, health, stop);
* labkit.serving.client: the retrying HTTP client, one request per answer;
* labkit.serving.watchdog: 503 bursts and stalls, seen live by the client;
* labkit.serving.replay: a recorded client log through the watchdog, and its timeline.
"""
