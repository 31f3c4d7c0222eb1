import { Link } from "../components/Link";
import { Page } from "../components/Page";
import { Empty } from "../components/States";

export function NotFound() {
  return (
    <Page title="Not found">
      <Empty title="This page does not exist">
        <Link href="/workloads" class="button">
          Go to the workloads
        </Link>
      </Empty>
    </Page>
  );
}
