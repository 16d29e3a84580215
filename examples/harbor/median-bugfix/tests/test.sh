#!/bin/bash
# The agent's module is imported from /app/src by the tests (that is what is being tested).
python3 -m pytest -q -p no:cacheprovider /tests/test_stats.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
