// A page's heading and title: the tab says where you are, and the heading takes the focus
// when the page changes, so a screen reader announces it.
import type { ComponentChildren } from "preact";
import { useEffect, useRef } from "preact/hooks";

export function Page({
  title,
  actions,
  children,
  wide = false,
}: {
  title: string;
  actions?: ComponentChildren;
  children: ComponentChildren;
  wide?: boolean;
}) {
  const heading = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    document.title = `${title} · Einsora`;
    heading.current?.focus({ preventScroll: true });
  }, [title]);
  return (
    <div class={`page${wide ? " wide" : ""}`}>
      <div class="page-head">
        <h1 ref={heading} tabIndex={-1}>
          {title}
        </h1>
        {actions ? <div class="page-actions">{actions}</div> : null}
      </div>
      {children}
    </div>
  );
}
