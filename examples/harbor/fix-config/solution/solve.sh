#!/bin/bash
set -e
# Only inside [server]: from the [server] header to the next section header.
sed -i '/^\[server\]/,/^\[/ { s/^port = 80$/port = 8080/; s/^debug = true$/debug = false/ }' /app/service.ini
