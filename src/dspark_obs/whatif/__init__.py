"""What another verify policy would have given on a recorded run's traffic (docs/whatif.md)."""
