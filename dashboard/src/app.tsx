// The shell: who is signed in, the navigation, and the page the path names. Signed out, every
// page but sign-in and join sends the person to sign in, and back where they were after.
import { useEffect } from "preact/hooks";
import { ApiError } from "./api/client";
import { Loading } from "./components/States";
import { Link } from "./components/Link";
import { Account } from "./pages/Account";
import { GatewayKeys } from "./pages/GatewayKeys";
import { Join } from "./pages/Join";
import { Launch } from "./pages/Launch";
import { Machines } from "./pages/Machines";
import { Members } from "./pages/Members";
import { NotFound } from "./pages/NotFound";
import { SignIn } from "./pages/SignIn";
import { Tokens } from "./pages/Tokens";
import { Usage } from "./pages/Usage";
import { WorkloadPage } from "./pages/Workload";
import { Workloads } from "./pages/Workloads";
import { type Route, location$, match, navigate } from "./router";
import { tell } from "./state/notice";
import { loadSession, session, signOut } from "./state/session";
import * as live from "./state/live";

const NAV: { href: Route; label: string; also?: Route[] }[] = [
  { href: "/workloads", label: "Workloads", also: ["/workloads/{id}", "/launch"] },
  { href: "/machines", label: "Machines" },
  { href: "/usage", label: "Usage" },
  { href: "/gateway-keys", label: "Gateway keys" },
  { href: "/tokens", label: "API tokens" },
  { href: "/members", label: "Members" },
];

function pathOf(at: string): string {
  const q = at.indexOf("?");
  return q >= 0 ? at.slice(0, q) : at;
}

export function App() {
  const path = pathOf(location$.value);
  const { route, params } = match(path);
  const who = session.value;

  useEffect(() => {
    void loadSession().catch(() => {
      // The api cannot be reached: the sign-in page says so when it tries.
      session.value = null;
    });
  }, []);

  useEffect(() => {
    if (who === null) live.stop();
  }, [who]);

  if (route === "/sign-in") return <SignIn />;
  if (route === "/join") return <Join />;
  if (who === undefined) {
    return (
      <main id="main" class="center">
        <Loading what="your session" />
      </main>
    );
  }
  if (who === null) {
    const next = location$.value === "/" ? "" : `?next=${encodeURIComponent(location$.value)}`;
    navigate(`/sign-in${next}`, { replace: true });
    return null;
  }
  if (route === "/") {
    navigate("/workloads", { replace: true });
    return null;
  }

  let page;
  switch (route) {
    case "/workloads":
      page = <Workloads />;
      break;
    case "/workloads/{id}":
      page = <WorkloadPage id={params.id ?? ""} key={params.id} />;
      break;
    case "/launch":
      page = <Launch />;
      break;
    case "/machines":
      page = <Machines />;
      break;
    case "/usage":
      page = <Usage />;
      break;
    case "/gateway-keys":
      page = <GatewayKeys />;
      break;
    case "/tokens":
      page = <Tokens />;
      break;
    case "/members":
      page = <Members />;
      break;
    case "/account":
      page = <Account />;
      break;
    default:
      page = <NotFound />;
  }

  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="top">
        <div class="top-row">
          <Link href="/workloads" class="brand">
            <img src="/favicon.svg" alt="" width="24" height="24" />
            Einsora
          </Link>
          <div class="who">
            <span class="tenant" title="tenant">
              {who.tenant.name}
            </span>
            <Link href="/account" class="user">
              {who.user.username}
            </Link>
            <button
              type="button"
              class="button small"
              onClick={async () => {
                try {
                  await signOut();
                } catch (failure) {
                  // Forgotten here all the same; say that the server may still hold it.
                  const id = failure instanceof ApiError && failure.requestId ? ` (request ${failure.requestId})` : "";
                  tell(`Signing out did not reach the server${id}: sign out again once it answers.`);
                }
                navigate("/sign-in", { replace: true });
              }}
            >
              Sign out
            </button>
          </div>
        </div>
        <nav aria-label="Main">
          <ul>
            {NAV.map((item) => {
              const current = route === item.href || (item.also ?? []).includes(route as Route);
              return (
                <li key={item.href}>
                  <Link href={item.href} aria-current={current ? "page" : undefined}>
                    {item.label}
                  </Link>
                </li>
              );
            })}
          </ul>
        </nav>
      </header>
      <main id="main" tabIndex={-1}>
        {page}
      </main>
    </>
  );
}
