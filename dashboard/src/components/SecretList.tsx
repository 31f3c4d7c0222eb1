// A page of credentials (API tokens, gateway keys): each made with its secret shown once,
// listed with when it was last used, and revoked at once. The pages say only what differs:
// their words, their columns, how to make one and how to revoke one.
import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiError } from "../api/client";
import { ErrorNote } from "./ErrorNote";
import { Page } from "./Page";
import { RevokeButton } from "./Revoke";
import { SecretOnce } from "./SecretOnce";
import { Empty, Failed, Loading } from "./States";

export type Column<T> = { label: string; cell: (item: T) => ComponentChildren };

export type Made = { label: string; secret: string; hint?: ComponentChildren };

export function SecretList<T extends { id: string; name: string }, M>(props: {
  title: string;
  lead: ComponentChildren;
  /** What they are, in "Loading …" and "Could not load …". */
  noun: string;
  heading: string;
  /** Each row's `data-<row>` attribute holds its id (for tests and scripts). */
  row: string;
  list: () => Promise<T[]>;
  columns: Column<T>[];
  empty: { title: string; body: ComponentChildren };
  make: (onMade: (made: M) => void) => ComponentChildren;
  shown: (made: M) => Made;
  revoke: { what: (item: T) => string; consequence: string; call: (item: T) => Promise<unknown> };
}) {
  const [items, setItems] = useState<T[] | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [revokeError, setRevokeError] = useState<ApiError | null>(null);
  const [made, setMade] = useState<Made | null>(null);
  const load = () => {
    setError(null);
    props
      .list()
      .then(setItems)
      .catch((failure: unknown) => setError(failure instanceof ApiError ? failure : null));
  };
  useEffect(load, []);
  const headingId = `${props.row}s-heading`;
  return (
    <Page title={props.title}>
      <p class="lead">{props.lead}</p>
      {props.make((created) => {
        setMade(props.shown(created));
        load();
      })}
      {made ? (
        <div class="card highlight">
          <SecretOnce label={made.label} secret={made.secret} />
          {made.hint ? <p class="hint">{made.hint}</p> : null}
          <button type="button" class="button small" onClick={() => setMade(null)}>
            I have copied it
          </button>
        </div>
      ) : null}
      <ErrorNote error={revokeError} />
      <section class="card" aria-labelledby={headingId}>
        <h2 id={headingId}>{props.heading}</h2>
        {error ? (
          <Failed what={props.noun} error={error} retry={load} />
        ) : items === null ? (
          <Loading what={props.noun} />
        ) : items.length === 0 ? (
          <Empty title={props.empty.title}>{props.empty.body}</Empty>
        ) : (
          <div class="table-wrap">
            <table class="table responsive">
              <thead>
                <tr>
                  {props.columns.map((c) => (
                    <th scope="col" key={c.label}>
                      {c.label}
                    </th>
                  ))}
                  <th scope="col">
                    <span class="visually-hidden">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {items.map((item) => (
                  <tr key={item.id} {...{ [`data-${props.row}`]: item.id }}>
                    {props.columns.map((c) => (
                      <td data-label={c.label} key={c.label}>
                        {c.cell(item)}
                      </td>
                    ))}
                    <td data-label="">
                      <RevokeButton
                        what={props.revoke.what(item)}
                        consequence={props.revoke.consequence}
                        onRevoke={async () => {
                          setRevokeError(null);
                          try {
                            await props.revoke.call(item);
                            load();
                          } catch (failure) {
                            setRevokeError(failure instanceof ApiError ? failure : null);
                          }
                        }}
                      />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </Page>
  );
}

/** A name with its id beneath it, the first column of every credential list. */
export function Named({ name, id, badge }: { name: string; id: string; badge?: ComponentChildren }) {
  return (
    <div>
      <strong>{name}</strong>
      {badge}
      <div class="mono dim small">{id}</div>
    </div>
  );
}
