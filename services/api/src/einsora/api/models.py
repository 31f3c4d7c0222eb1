"""The api's tables (SQLAlchemy Core): tenants, users, members, invitations, API tokens,
workloads, timeline, outbox, idempotency keys, access tickets, tenant limits, gateway keys,
tenant quotas, join tokens, enrolled machines, machine invitations, the activity log, the
dashboard's sessions and sign-in links, and password sign-in attempts.

The api owns these tables and no other service reads them (DESIGN.md). Every time is stored in
UTC and read back timezone-aware; the migrations in `migrations/versions` create exactly this
shape (a test compares the two on both engines).
"""

from __future__ import annotations

import sqlalchemy as sa

from einsora.store import UtcDateTime

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

ID = sa.String(32)
NAME = sa.String(64)
AUTO_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""An autoincrementing key: SQLite only autoincrements `INTEGER PRIMARY KEY`."""


tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("name", NAME, nullable=False, unique=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("username", NAME, nullable=False, unique=True),
    sa.Column("is_operator", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    # The dashboard's password (ADR-0019): an Argon2id hash in PHC form, or null (none set).
    sa.Column("password_hash", sa.String(255), nullable=True),
    sa.Column("password_set_at", UtcDateTime(), nullable=True),
    # Whether the password signs in with operator rights (issue 34, N2): only when the
    # credential that set it carried them, or proved the current password that did.
    sa.Column("password_operator", sa.Boolean(), nullable=False, server_default=sa.false()),
)

members = sa.Table(
    "members",
    metadata,
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), primary_key=True),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), primary_key=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("name", NAME, nullable=False),
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=True),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    sa.Column("last_used_at", UtcDateTime(), nullable=True),
    # Operator rights are a property of the token, minted only by the operator for themself
    # (ADR-0008): a token made any other way never carries them, whoever its user is.
    sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Index(None, "tenant_id", "user_id", "id"),
)

invitations = sa.Table(
    "invitations",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("username", NAME, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    # Set when the user existed at invitation time: only that user may accept, signed in.
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=True),
    # Set when the user is new: the one-time code they open (its hash; the code is shown once).
    sa.Column("secret_sha256", sa.String(64), nullable=True, unique=True),
    sa.Column("invited_by", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("accepted_at", UtcDateTime(), nullable=True),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    sa.Index(None, "tenant_id", "id"),
    sa.Index(None, "user_id", "id"),
)

ENDPOINT_NAME_TAKEN = sa.text("kind = 'endpoint' AND replica_of IS NULL AND state <> 'removed'")

workloads = sa.Table(
    "workloads",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("created_by", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("name", NAME, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("class_name", NAME, nullable=False),
    sa.Column("count", sa.Integer(), nullable=False),
    sa.Column("region", NAME, nullable=False),
    sa.Column("spec", sa.Text(), nullable=False),
    sa.Column("fallback", sa.Text(), nullable=False),
    sa.Column("fallback_after_s", sa.Float(), nullable=False, server_default="0"),
    # The region whose scheduler holds it now: NULL until a region step hands it over
    # (ADR-0022); its intents go to this region's subject.
    sa.Column("current_region", NAME, nullable=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("placed_region", NAME, nullable=True),
    sa.Column("placed_machine", NAME, nullable=True),
    sa.Column("placed_class", NAME, nullable=True),
    sa.Column("last_seq", sa.BigInteger(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    # An endpoint's further replicas point at the first (which the user launched and acts on).
    sa.Column("replica_of", ID, sa.ForeignKey("workloads.id"), nullable=True),
    sa.Index(None, "tenant_id", "id"),
    sa.Index(None, "tenant_id", "state", "id"),
    sa.Index(None, "tenant_id", "kind", "id"),
    sa.Index(None, "replica_of"),
    # An endpoint's name is its model name in the gateway: one live endpoint per name and
    # tenant, enforced by the database so that concurrent launches cannot both take it.
    sa.Index(
        "uq_workloads_endpoint_name",
        "tenant_id",
        "name",
        unique=True,
        sqlite_where=ENDPOINT_NAME_TAKEN,
        postgresql_where=ENDPOINT_NAME_TAKEN,
    ),
)

timeline = sa.Table(
    "timeline",
    metadata,
    sa.Column("id", AUTO_ID, primary_key=True, autoincrement=True),
    sa.Column("workload_id", ID, sa.ForeignKey("workloads.id"), nullable=False),
    sa.Column("at", UtcDateTime(), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=True),
    sa.Column("event_id", sa.String(64), nullable=True, unique=True),
    sa.Column("seq", sa.BigInteger(), nullable=True),
    # Where the entry's event placed the workload (NULL: it placed nothing, or it came before
    # migration 0014): the export's placement history reads it.
    sa.Column("placed_region", NAME, nullable=True),
    sa.Column("placed_machine", NAME, nullable=True),
    sa.Column("placed_class", NAME, nullable=True),
    sa.Index(None, "workload_id", "at", "id"),
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", AUTO_ID, primary_key=True, autoincrement=True),
    sa.Column("intent_id", ID, nullable=False, unique=True),
    sa.Column("subject", sa.String(255), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=False),
    sa.Column("traceparent", sa.String(64), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("sent_at", UtcDateTime(), nullable=True),
    sa.Index(
        "ix_outbox_unsent",
        "id",
        sqlite_where=sa.text("sent_at IS NULL"),
        postgresql_where=sa.text("sent_at IS NULL"),
    ),
)

idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), primary_key=True),
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("workload_id", ID, sa.ForeignKey("workloads.id"), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

access_tickets = sa.Table(
    "access_tickets",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("workload_id", ID, sa.ForeignKey("workloads.id"), nullable=False),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("redeemed_at", UtcDateTime(), nullable=True),
    sa.Column("mint_request_id", sa.String(64), nullable=False),
    sa.Column("redeem_request_id", sa.String(64), nullable=True),
    sa.Index(None, "workload_id"),
)

tenant_limits = sa.Table(
    "tenant_limits",
    metadata,
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), primary_key=True),
    # The operator's cap on the tenant's workloads that are not removed; NULL: no cap. A tenant
    # without a row has the default cap of the settings (`tenant_max_workloads`).
    sa.Column("max_workloads", sa.Integer(), nullable=True),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
)

gateway_keys = sa.Table(
    "gateway_keys",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("name", NAME, nullable=False),
    # The SHA-256 of the whole `esk_…` key, as the gateway looks it up; the key is stored nowhere.
    sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
    # A JSON list of the endpoint names the key may use; NULL: every endpoint of the tenant.
    sa.Column("models", sa.Text(), nullable=True),
    sa.Column("rpm", sa.Integer(), nullable=True),
    sa.Column("tpm", sa.Integer(), nullable=True),
    sa.Column("max_tokens_default", sa.Integer(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=True),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    # When the gateway last counted a request with it (`consumers/key_use.py`, from its token
    # counts).
    sa.Column("last_used_at", UtcDateTime(), nullable=True),
    sa.Index(None, "tenant_id", "user_id", "id"),
    sa.Index(None, "tenant_id", "id"),
    # The key sync reads the live keys every minute; revoked ones pile up and are never read.
    sa.Index(
        "ix_gateway_keys_live",
        "id",
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    ),
)

tenant_quotas = sa.Table(
    "tenant_quotas",
    metadata,
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), primary_key=True),
    # The operator's quota, each part optional (NULL or `{}`: no limit of that kind); the
    # scheduler reads it from KV `usage/quota.<tenant>`, which `projections/quotas.py` keeps equal.
    sa.Column("max_gpus", sa.Text(), nullable=False),  # JSON: GPU class -> devices at once
    sa.Column("max_gpus_total", sa.Integer(), nullable=True),
    sa.Column("gpu_hours_per_7d", sa.Float(), nullable=True),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
)

MACHINE_INVITATION_LIVE = sa.text("revoked_at IS NULL")

MACHINE_ID = sa.String(128)
"""A machine id: `m-…` when the api made it at enrolment; Solo's own machine keeps its id."""

join_tokens = sa.Table(
    "join_tokens",
    metadata,
    sa.Column("id", ID, primary_key=True),
    # The machines that join with it are this tenant's, owned by its creator.
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("name", NAME, nullable=False),
    # The SHA-256 of the whole `agt_…` token; the token is stored nowhere.
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("region", NAME, nullable=False),
    sa.Column("sharing", sa.String(16), nullable=False),
    sa.Column("tunnel", sa.Boolean(), nullable=False),
    sa.Column("address", sa.String(64), nullable=True),
    sa.Column("by_operator", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("max_uses", sa.Integer(), nullable=False),
    sa.Column("uses", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    sa.Index(None, "tenant_id", "id"),
)

machines = sa.Table(
    "machines",
    metadata,
    sa.Column("id", MACHINE_ID, primary_key=True),
    sa.Column("owner_tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("owner_user_id", ID, sa.ForeignKey("users.id"), nullable=True),
    sa.Column("region", NAME, nullable=False),
    sa.Column("sharing", sa.String(16), nullable=False),
    sa.Column("hostname", sa.String(255), nullable=False),
    # The SHA-256 of the machine's `agk_…` credential (NULL: it has none, e.g. Solo's own
    # machine, which uses the nkey Solo made for it).
    sa.Column("credential_sha256", sa.String(64), nullable=True, unique=True),
    sa.Column("tunnel", sa.Boolean(), nullable=False),
    sa.Column("tunnel_key", sa.Text(), nullable=True),
    sa.Column("address", sa.String(64), nullable=True),
    sa.Column("join_token_id", ID, sa.ForeignKey("join_tokens.id"), nullable=True),
    sa.Column("enrolled_at", UtcDateTime(), nullable=False),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    # Owner reclaim (ADR-0017): how long guests keep running after a reclaim, the least they
    # run before one preempts them, and since when the owner reclaims it (NULL: released).
    sa.Column("reclaim_grace_s", sa.Float(), nullable=False, server_default="120"),
    sa.Column("guest_min_runtime_s", sa.Float(), nullable=False, server_default="600"),
    sa.Column("reclaimed_at", UtcDateTime(), nullable=True),
    # The owner's lend (issue 15): what Einsora may use of the machine's inventory. NULL: all
    # of that resource; `lend_gpus` is a JSON list of GPU uuids (`[]`: none).
    sa.Column("lend_cpus", sa.Float(), nullable=True),
    sa.Column("lend_memory_mib", sa.BigInteger(), nullable=True),
    sa.Column("lend_gpus", sa.Text(), nullable=True),
    sa.Index(None, "owner_tenant_id", "id"),
)

machine_invitations = sa.Table(
    "machine_invitations",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("machine_id", MACHINE_ID, sa.ForeignKey("machines.id"), nullable=False),
    # The guest, one of two: a tenant invited to use the machine (its admins accept), or a
    # user (who accepts, and whose workloads may use it whatever tenant they launch in).
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=True),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=True),
    sa.Column("invited_by", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("accepted_at", UtcDateTime(), nullable=True),
    sa.Column("accepted_by", ID, sa.ForeignKey("users.id"), nullable=True),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    sa.Index(None, "machine_id", "id"),
    sa.Index(None, "tenant_id", "id"),
    sa.Index(None, "user_id", "id"),
    # One live invitation per machine and guest, kept by the database, so two owners' admins
    # inviting at once cannot make two (the second answers with the first).
    sa.Index(
        "uq_machine_invitations_live",
        "machine_id",
        "tenant_id",
        unique=True,
        sqlite_where=MACHINE_INVITATION_LIVE,
        postgresql_where=MACHINE_INVITATION_LIVE,
    ),
    sa.Index(
        "uq_machine_invitations_live_user",
        "machine_id",
        "user_id",
        unique=True,
        sqlite_where=MACHINE_INVITATION_LIVE,
        postgresql_where=MACHINE_INVITATION_LIVE,
    ),
    sa.CheckConstraint(
        "(tenant_id IS NULL) <> (user_id IS NULL)", name="ck_machine_invitations_one_guest"
    ),
)
"""Invitations of a tenant or a user to use a machine (issue 15): accepted and not revoked, the
tenant is one of the machine's `guests`, the user one of its `guest_users` (which count while
its sharing is not private)."""

activity = sa.Table(
    "activity",
    metadata,
    sa.Column("seq", AUTO_ID, primary_key=True, autoincrement=True),
    sa.Column("at", UtcDateTime(), nullable=False),
    # No foreign keys: the record of what happened outlives what it names, and writing it
    # must never fail on a row another transaction is changing.
    sa.Column("tenant_id", ID, nullable=False),
    sa.Column("user_id", ID, nullable=True),
    # The id of the credential the action was made with (API token, join token, access
    # ticket), never its secret.
    sa.Column("token_id", ID, nullable=True),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("route", sa.String(255), nullable=False),
    sa.Column("target", MACHINE_ID, nullable=True),
    sa.Column("outcome", sa.String(8), nullable=False),
    sa.Column("status", sa.Integer(), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=False),
    sa.Index(None, "tenant_id", "seq"),
    sa.Index(None, "at"),
)
"""The activity log (issue 17): one row per API action, written in the transaction of the change
it records (`store.py`); tenant admins read it, and rows past the retention are purged."""

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", ID, primary_key=True),
    # The cookie's secret is never stored: only its SHA-256, as for API tokens.
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=False),
    # Operator rights, as a token's (ADR-0008): only from the operator's own sign-in.
    sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.false()),
    # How it began: `link`, `password` or `invitation`.
    sa.Column("method", sa.String(16), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("last_seen_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("ended_at", UtcDateTime(), nullable=True),
    # When the credential it came from expires (a link minted with an expiring token): what
    # the session makes never outlives it (issue 34, N12). NULL: it inherited no bound.
    sa.Column("credential_expires_at", UtcDateTime(), nullable=True),
    sa.Index(None, "user_id", "id"),
)
"""The dashboard's sessions (ADR-0019): a host-only HttpOnly cookie holds the secret; a session
ends when its user signs out, after `session_idle_hours` unused, or `session_max_days` after it
began, whichever comes first."""

sign_in_links = sa.Table(
    "sign_in_links",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("tenant_id", ID, sa.ForeignKey("tenants.id"), nullable=False),
    sa.Column("user_id", ID, sa.ForeignKey("users.id"), nullable=False),
    sa.Column("operator", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("used_at", UtcDateTime(), nullable=True),
    # When the credential that minted it expires; its session inherits it (issue 34, N12).
    sa.Column("credential_expires_at", UtcDateTime(), nullable=True),
)
"""One-time sign-in links (ADR-0019): Solo's first start prints one for the owner, and
`einsora dashboard` asks for one for its caller; the code is exchanged for a session once."""

sign_in_attempts = sa.Table(
    "sign_in_attempts",
    metadata,
    # `user` (a username as typed) or `address` (the client's, as `trusted_proxies` allow).
    sa.Column("kind", sa.String(8), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("window_start", UtcDateTime(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Index(None, "window_start"),
)
"""Password sign-ins counted per username and per client address in fixed windows (issue 34,
N5): each attempt takes its place here, in one conditional UPDATE, before its password is
checked, so a burst across any number of api replicas is decided one attempt at a time."""
