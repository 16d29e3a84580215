#!/bin/bash
# the third field of every line is its level
cut -d' ' -f3 /app/data/*.log | grep -cx ERROR > /app/error_count.txt
