#!/bin/sh
# Stands in for python3 in tests/tests/ec_golden.rs: copies the frames the golden
# sessions hand to Python (one "<kind> <hex>" line each) to $SEED_FRAMES, then runs
# the real check so the test still passes or fails on its own.
tee "$SEED_FRAMES" | exec python3 "$@"
