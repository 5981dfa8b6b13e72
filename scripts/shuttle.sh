#!/usr/bin/env bash
RUSTFLAGS="--cfg shuttle" CARGO_TARGET_DIR=/var/tmp/idem-target-shuttle cargo test -p idem-core --test shuttle
