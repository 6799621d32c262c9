"""linkpassd, the host daemon: a reconcile loop and its collaborators.

  loop.py        Daemon: the queue, the reconcile loop, health, policy, kernel writes
  probes.py      Probes: BFD sessions, the echo service and the echo responder
  statefiles.py  StateFiles: verdicts, allocation, drains and mesh files
  operations.py  EventRecorder, Drains, HealthPublisher: what operators see and do
  status.py      StatusReport: status, explain and sensors, read-only
  aggregator.py  AggregatorLink: the agent's stream to linkpass-aggregator
  wiring.py      pure derivations of the probes and sensor from the config
  cli.py         main(): arguments, config, instance lock, run

docs/architecture.md follows one event through them.
"""
