#!/bin/bash
# plausible but wrong: matches "ERROR" anywhere in the line (e.g. "ERRORS=0")
grep -h ERROR /app/data/*.log | wc -l > /app/error_count.txt
