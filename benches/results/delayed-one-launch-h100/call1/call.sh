#!/usr/bin/env bash
cd "$(dirname "$0")"
bash call1.sh
bash call2.sh
