#!/usr/bin/env bash
# Call 8: the review commit (ordering read once per process): the CUDA module suite, default
# ordering and LOWP_STREAM_ORDERING=device-flags.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
t=$(ls bin/test-modules* | head -1)
timeout 150 $t --test-threads=1 > $OUT/test-modules.log 2>&1; echo "modules rc=$?"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head
LOWP_STREAM_ORDERING=device-flags timeout 150 $t --test-threads=1 > $OUT/test-modules-device-flags.log 2>&1; echo "modules (device-flags) rc=$?"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules-device-flags.log | head
