#!/bin/bash
python3 /solution/report.py
