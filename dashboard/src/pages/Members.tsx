// Members of the tenant, and (for its admins) invitations: a new user gets a one-time link to
// choose their password; an existing user accepts signed in as themself (ADR-0008).
import { useEffect, useState } from "preact/hooks";
import { ApiError, type Schemas, allPages, api, ok } from "../api/client";
import { CopyButton } from "../components/CopyButton";
import { ErrorNote } from "../components/ErrorNote";
import { Field, described } from "../components/Field";
import { Page } from "../components/Page";
import { RevokeButton } from "../components/Revoke";
import { Empty, Failed, Loading } from "../components/States";
import { when } from "../lib/format";
import { session } from "../state/session";

type Member = Schemas["MemberOut"];
type Invitation = Schemas["InvitationOut"];

export function Members() {
  const who = session.value;
  const tenant = who?.tenant.id ?? "";
  const admin = who?.role === "admin" || who?.operator === true;
  const [members, setMembers] = useState<Member[] | null>(null);
  const [invitations, setInvitations] = useState<Invitation[] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [made, setMade] = useState<Schemas["InvitationCreated"] | null>(null);
  const [revokeError, setRevokeError] = useState<ApiError | null>(null);

  const load = () => {
    setError(null);
    const path = { id: tenant };
    allPages((cursor) => ok(api.GET("/v1/tenants/{id}/members", { params: { path, query: { limit: 200, cursor } } })))
      .then(setMembers)
      .catch((failure: unknown) => setError(failure instanceof ApiError ? failure : null));
    if (admin) {
      allPages((cursor) =>
        ok(api.GET("/v1/tenants/{id}/invitations", { params: { path, query: { limit: 200, cursor } } })),
      )
        .then(setInvitations)
        .catch(() => setInvitations([]));
    }
  };
  useEffect(load, [tenant]);

  const link = made?.code ? `${location.origin}/join#code=${made.code}` : null;
  const open = (invitations ?? []).filter((i) => !i.accepted_at && !i.revoked_at && Date.parse(i.expires_at) > Date.now());
  return (
    <Page title="Members">
      <p class="lead">The people of {who?.tenant.name}.</p>
      {admin ? (
        <Invite
          tenant={tenant}
          onMade={(invitation) => {
            setMade(invitation);
            load();
          }}
        />
      ) : null}
      {made ? (
        <div class="card highlight" role="region" aria-label="The new invitation">
          {link ? (
            <>
              <p>
                Send <strong>{made.username}</strong> this link; it works once, until {when(made.expires_at)}. They
                choose their password there.
              </p>
              <div class="secret-row">
                <input class="mono" readOnly value={link} aria-label="Invitation link" onFocus={(e) => e.currentTarget.select()} />
                <CopyButton text={link} />
              </div>
            </>
          ) : (
            <p>
              <strong>{made.username}</strong> has an account already: they accept the invitation signed in
              as themself (<code>einsora invitations accept {made.id}</code>).
            </p>
          )}
          <button type="button" class="button small" onClick={() => setMade(null)}>
            Done
          </button>
        </div>
      ) : null}
      <section class="card" aria-labelledby="members-heading">
        <h2 id="members-heading">Members</h2>
        {error ? (
          <Failed what="members" error={error} retry={load} />
        ) : members === null ? (
          <Loading what="members" />
        ) : members.length === 0 ? (
          <Empty title="No members" />
        ) : (
          <ul class="plain list">
            {members.map((m) => (
              <li key={m.user.id}>
                <strong>{m.user.username}</strong> <span class="badge tone-idle">{m.role}</span>{" "}
                <span class="dim">since {when(m.created_at)}</span>
              </li>
            ))}
          </ul>
        )}
      </section>
      {admin && open.length > 0 ? (
        <section class="card" aria-labelledby="invitations-heading">
          <h2 id="invitations-heading">Open invitations</h2>
          <ErrorNote error={revokeError} />
          <ul class="plain list">
            {open.map((i) => (
              <li key={i.id}>
                <strong>{i.username}</strong> as {i.role} <span class="dim">until {when(i.expires_at)}</span>{" "}
                <RevokeButton
                  what={`the invitation of ${i.username}`}
                  consequence="Its link stops working."
                  onRevoke={async () => {
                    setRevokeError(null);
                    try {
                      await ok(
                        api.DELETE("/v1/tenants/{id}/invitations/{invitation}", {
                          params: { path: { id: tenant, invitation: i.id } },
                        }),
                      );
                    } catch (failure) {
                      setRevokeError(failure instanceof ApiError ? failure : null);
                    }
                    load();
                  }}
                />
              </li>
            ))}
          </ul>
        </section>
      ) : null}
    </Page>
  );
}

function Invite({ tenant, onMade }: { tenant: string; onMade: (made: Schemas["InvitationCreated"]) => void }) {
  const [username, setUsername] = useState("");
  const [role, setRole] = useState<Schemas["Role"]>("member");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      onMade(
        await ok(
          api.POST("/v1/tenants/{id}/invitations", {
            params: { path: { id: tenant } },
            body: { username: username.trim(), role },
          }),
        ),
      );
      setUsername("");
    } catch (failure) {
      setError(failure instanceof ApiError ? failure : null);
    } finally {
      setBusy(false);
    }
  };
  const f = (field: string) => error?.forField(field);
  return (
    <form class="card form" onSubmit={submit} noValidate aria-labelledby="invite-heading">
      <h2 id="invite-heading">Invite someone</h2>
      <ErrorNote error={error && !f("username") ? error : null} />
      <div class="row">
        <Field id="invite-username" label="Username" hint="Lowercase letters, digits, . _ -" error={f("username")}>
          <input
            {...described("invite-username", f("username"), true)}
            autoCapitalize="none"
            spellcheck={false}
            value={username}
            onInput={(e) => setUsername(e.currentTarget.value)}
          />
        </Field>
        <Field id="invite-role" label="Role">
          <select id="invite-role" value={role} onChange={(e) => setRole(e.currentTarget.value as Schemas["Role"])}>
            <option value="member">Member</option>
            <option value="admin">Admin (invites others)</option>
          </select>
        </Field>
      </div>
      <div class="actions">
        <button type="submit" class="button primary" disabled={busy}>
          {busy ? "Inviting…" : "Invite"}
        </button>
      </div>
    </form>
  );
}
