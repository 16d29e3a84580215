#!/bin/bash
# plausible but wrong: changes every port, including the metrics one
sed -i 's/^port = .*/port = 8080/; s/^debug = true$/debug = false/' /app/service.ini
