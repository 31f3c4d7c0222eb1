// An <a> that moves within the app without reloading (a modified click opens a tab as usual).
import type { JSX } from "preact";
import { navigate } from "../router";

export function Link(props: JSX.HTMLAttributes<HTMLAnchorElement> & { href: string }) {
  const { href, onClick, ...rest } = props;
  return (
    <a
      href={href}
      {...rest}
      onClick={(event) => {
        if (onClick) (onClick as (e: MouseEvent) => void)(event);
        if (
          event.defaultPrevented ||
          event.button !== 0 ||
          event.metaKey ||
          event.ctrlKey ||
          event.shiftKey ||
          event.altKey
        ) {
          return;
        }
        event.preventDefault();
        navigate(href);
      }}
    />
  );
}
