"""One local SparkSession for every Spark test module (starting a JVM costs seconds).

`spark()` builds it on first use — `local[2]`, no UI, two shuffle partitions, its Python
workers running this interpreter (`PYSPARK_PYTHON`), so executors import this checkout's
raftmq — and every later call returns the same session; it stops when the test process
ends. Tests that need it skip, naming the reason, only when there is no Java to run Spark.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
from functools import cache
from typing import Any

import pytest

JAVA = shutil.which("java") or (
    os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
)

requires_java = pytest.mark.skipif(
    JAVA is None or not os.path.exists(JAVA),
    reason="Spark needs Java 17 (no `java` on PATH and no JAVA_HOME)",
)


@cache
def spark() -> Any:
    from pyspark.sql import SparkSession

    import raftmq.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("raftmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    raftmq.spark.register(session)
    atexit.register(session.stop)
    return session
