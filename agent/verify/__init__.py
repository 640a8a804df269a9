"""Verification and benchmarking, in one wing: everything that decides whether a candidate is right and fast.

Parent side (trusted; the candidate never runs here):
  run.py        `verify()`: the entry point, the check ids, a task from a standalone reference
  cases.py      the models and input sets a candidate is run on
  judge.py      what came back from the box, turned into checks against references computed here
  numerics.py   tolerances by dtype, against a float64 reference
  sanitizer.py  on a GPU: compute-sanitizer's report as checks
  interpreter_race.py  on a GPU: the race check of Triton kernels, in the interpreter on the node's CPU
  compile_gate.py      every kernel compiled ahead of time for the GPU target (the Triton part runs in the box)
  bench.py      interleaved timing rounds, medians, noise; timed outputs checked
  evaluate.py   one candidate through verify and bench, as the optimize loop sees it

In the box (run by the sandbox as `python -c`, starting harness.main: sandbox/box.py HARNESS_ARGS):
  harness.py    the entry point: the harness's jobs (verify, bench, sanitize, build, noop) and its handle on the
                runners it forks, which alone run candidate code
  runner.py     a runner process: its confinement, bound tools, request loop and the observations around each call
  runner_calls.py  the runner's side of the sampled pass and the op log's call
  parent_sampling.py  the harness's side of the sampled pass: the runner's calls sampled from outside its process
  runner_channel.py  the channel between the two: frames, plain-data replies, tensors as plain data
  probes.py, triton_check.py, cuda_check.py   observations made in a runner around the candidate's calls
  disguise.py, clocks.py   what the candidate's process says of itself (stack, modules, command line, environment,
                clocks) made to say nothing of verification

Both sides: messages.py, the typed messages the parent, the harness and its runners exchange (and how outputs are
laid out); sampling.py, where a call's CPU time is spent, by the code it ran in (the candidate's calls sampled by the
harness from outside its runner, the reference's here in the parent's own process).

This file imports nothing, so starting the harness in the box loads only what the harness needs.
"""
