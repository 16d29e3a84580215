"""Parse /app/service.ini and compare every section and key with the expected configuration."""
import configparser
import sys

expected = {
    "server": {"host": "0.0.0.0", "port": "8080", "debug": "false", "workers": "4"},
    "metrics": {"port": "9100", "path": "/metrics"},
    "database": {"url": "postgres://db.internal:5432/app", "pool": "10"},
}
config = configparser.ConfigParser()
try:
    config.read_string(open("/app/service.ini").read())
except (OSError, configparser.Error) as e:
    sys.exit(f"cannot read service.ini: {e}")
got = {s: dict(config[s]) for s in config.sections()}
if got != expected:
    sys.exit(f"configuration differs: {got}")
print("service.ini is fixed")
