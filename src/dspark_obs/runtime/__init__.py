"""The reference DSpark runtime: a synthetic target and block drafter, the confidence head with
STS, the SPS scheduler and the three verify modes, run on a CPU (docs/runtime.md)."""
