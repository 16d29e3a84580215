#!/bin/bash
# Harbor verifier entry point: the reward (1 or 0) goes to /logs/verifier/reward.txt.
python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
