"""Credentials never come from the registry, and never reach a log: the one rule, written once.

Registry files are plain data in git, shown in DAG details, and copied into every spark-submit
command line, which Airflow logs. So a ``spark.conf`` / ``spark.hadoop_conf`` key that names a
credential (``fs.s3a.secret.key``, ``fs.s3a.session.token``, ``fs.azure.account.key.<acct>...``,
``spark.executorEnv.AWS_SECRET_ACCESS_KEY``...) is refused when the registry is loaded
(:func:`credential_key`), and so is any registry value that carries one under a key that names none
(:func:`credential_in_value`: ``thrift://user:pw@host``, a JDBC URL's ``password=``, ``-D...secret...=``
in Java options); every command this package logs is masked (:func:`mask_credentials`)
as a safety net for what reaches it by another way (a Spark connection's extras, a provider default).
"""

from __future__ import annotations

import re

# What a credential's property name says, matched on the key lower-cased with '_' and '-' as '.':
# AWS_SECRET_ACCESS_KEY, fs.s3a.access.key, fs.s3a.session.token, fs.azure.account.key.<acct>.dfs...,
# fs.azure.sas.<container>.<acct>..., fs.gs.auth.service.account.private.key, spark.ssl.keyPassword,
# spark.authenticate.secret, a kubernetes oauthToken, fs.s3a.encryption.key (an SSE-C key).
_CREDENTIAL = re.compile(
    r"secret|passw(?:or)?d|token|credential|(?:access|account|private|session|api|auth|encryption|"
    r"server\.side\.encryption|sse\.c)\.?key|(?:^|\.)sas(?:\.|$)|signature"
)
# Keys that name where a credential comes from, not the credential itself: a provider class
# (fs.s3a.aws.credentials.provider), a file or path to one, a type or binding, a switch.
_NOT_A_CREDENTIAL = re.compile(
    r"(?:provider|providers|file|path|dir|type|binding|impl|class|enabled|algorithm|kind|renewer|"
    r"url|uri|endpoint|mechanism|interval|timeout|ttl|expiry|expiration)$"
)

#: Where credentials go instead, for the registry's refusal (what the engines support).
WHERE_CREDENTIALS_BELONG = (
    "registry files are data (in git, in the DAG details and in the logged spark-submit command), never "
    "credentials. Give the job its credentials from its environment instead: an instance profile or IAM role "
    "(EMR's EC2 role, IRSA), or the environment of the Spark workers, picked up by a credentials provider "
    "named here (e.g. fs.s3a.aws.credentials.provider: "
    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider); the Airflow side's live in the "
    "Airflow connections (storage_conn_id, spark.conn_id, spark.emr.aws_conn_id)"
)


def _normalized(key: str) -> str:
    # camelCase parts stay glued (oauthToken -> oauthtoken): 'token' still matches inside.
    return re.sub(r"[_\-]+", ".", key.lower())


def credential_key(key: str) -> bool:
    """True if a Spark or Hadoop property named ``key`` holds a credential (its value is a secret)."""
    k = _normalized(key)
    return bool(_CREDENTIAL.search(k)) and not _NOT_A_CREDENTIAL.search(k)


# The key of a key=value: scanning resumes right after its '=', so an assignment inside another
# value (-Dfs.s3a.secret.key=... in spark.driver.extraJavaOptions, password=... in a JDBC URL's query
# or its ';' options) is found too. A key stops at what separates URL parameters and options.
_KEY = re.compile(r"[^\s=\"'&;?,()]+(?==)")
_VALUE = re.compile(r"'[^']*'|\"[^\"]*\"|\S*")
# A URI's user info: scheme://user:password@host. The authority runs to the first '/', '?', '#' or
# space, and its user info to the last '@' in it (a password may hold an unencoded '@').
_URI_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#]*)@")


def _mask_userinfo(m: re.Match[str]) -> str:
    user, colon, _password = m.group("userinfo").partition(":")
    return f"{m.group('scheme')}{user}{colon}{'******' if colon else ''}@"


def credential_in_value(value: str) -> str | None:
    """What credential ``value`` (a registry value: a Spark setting, a URI, Java options) holds, or None.

    The answer names the kind and the key, never the secret: user info in a URI (``s3a://KEY:SECRET@bucket``,
    ``thrift://user:pw@host``, ``jdbc:postgresql://u:pw@h/db``) or an assignment to a credential key inside
    it (``?password=`` of a JDBC URL, ``-Dfs.s3a.secret.key=`` of Java options).
    """
    if (m := _URI_USERINFO.search(value)) is not None:
        return f"user info in the URI {m.group('scheme')}...@ (a user name and password)"
    for m in _KEY.finditer(value):
        if credential_key(m.group(0)):
            return f"an assignment {m.group(0)}=... (a credential)"
    return None


def mask_credentials(text: str) -> str:
    """``text`` (a command line, a log line, an error) with every credential in it replaced by ******.

    The password of a URI's user info (``scheme://user:******@host``), and the value of every
    ``key=value`` whose key names a credential: a ``--conf`` setting, a ``-D`` option inside Java
    options, a ``password=`` parameter of a URL or a libpq connection string. A value in quotes is
    masked to its closing quote, an unquoted one to the next space.
    """
    text = _URI_USERINFO.sub(_mask_userinfo, text)
    out: list[str] = []
    copied = pos = 0
    while (m := _KEY.search(text, pos)) is not None:
        start = m.end() + 1  # after the '='
        if not credential_key(m.group(0)):
            pos = start
            continue
        value = _VALUE.match(text, start)
        end = value.end() if value else start
        quote = text[start] if end - start > 1 and text[start] in "'\"" and text[end - 1] == text[start] else ""
        # An unquoted value inside a quoted string ("-Dx.secret=abc") keeps that string's closing quote.
        closing = "" if quote else text[start:end][len(text[start:end].rstrip("'\"")) :]
        out.append(f"{text[copied:start]}{quote}******{quote}{closing}")
        copied = pos = max(end, start)
    out.append(text[copied:])
    return "".join(out)
