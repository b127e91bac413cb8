CREATE TABLE `domains` (
	`id` text PRIMARY KEY NOT NULL,
	`account_id` text NOT NULL,
	`app_id` text NOT NULL,
	`hostname` text NOT NULL,
	`status` text NOT NULL,
	`reason` text,
	`token` text NOT NULL,
	`redirect` text DEFAULT 'none' NOT NULL,
	`https_only` integer DEFAULT true NOT NULL,
	`certificate_id` text,
	`verified_at` integer,
	`checked_at` integer,
	`created_at` integer NOT NULL,
	FOREIGN KEY (`account_id`) REFERENCES `accounts`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`app_id`) REFERENCES `apps`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE UNIQUE INDEX `domains_account_hostname_idx` ON `domains` (`account_id`,`hostname`);--> statement-breakpoint
CREATE UNIQUE INDEX `domains_verified_hostname_idx` ON `domains` (`hostname`) WHERE status in ('pending_certificate', 'active');--> statement-breakpoint
CREATE INDEX `domains_app_idx` ON `domains` (`app_id`);--> statement-breakpoint
CREATE INDEX `domains_hostname_idx` ON `domains` (`hostname`,`status`);