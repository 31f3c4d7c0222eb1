// Who is signed in: the session the api answers for this browser's cookie (undefined while
// asking, null when signed out). The cookie itself is HttpOnly: script never reads it.
import { signal } from "@preact/signals";
import { ApiError, api, ok, setCsrfToken, type Session, whenSignedOut } from "../api/client";

export const session = signal<Session | null | undefined>(undefined);

/** Moves on at each sign-in and sign-out, so an answer to an older question is dropped (the
 * page asks who it is while a sign-in link is being exchanged). */
let generation = 0;

export function signedIn(found: Session): void {
  generation += 1;
  setCsrfToken(found.csrf_token);
  session.value = found;
}

export function signedOut(): void {
  generation += 1;
  setCsrfToken(null);
  session.value = null;
}

whenSignedOut(signedOut);

/** Ask the api who this browser is signed in as. */
export async function loadSession(): Promise<void> {
  const asked = generation;
  try {
    const found = await ok(api.GET("/v1/sessions/current"), { quiet: true });
    if (generation === asked) signedIn(found);
  } catch (error) {
    if (error instanceof ApiError && (error.status === 401 || error.status === 404)) {
      if (generation === asked) signedOut();
      return;
    }
    throw error;
  }
}

/** Sign out: the api ends the session for good, then the page forgets it. */
export async function signOut(): Promise<void> {
  try {
    await ok(api.DELETE("/v1/sessions/current"));
  } finally {
    signedOut();
  }
}
