#!/bin/bash
# Plain Python checks (no pytest): exit status 0 means every check passed.
if python3 /tests/check_config.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
